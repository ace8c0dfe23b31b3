"""The backends behind the engine's contract: OpenRouter (openrouter/) first."""
