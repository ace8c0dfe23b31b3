"""The simulators regen ships: the OpenRouter API (openrouter/) and, later, SGLang."""
