"""regen: generate LLM training data through OpenRouter and SGLang, steered from a terminal console.

The parts (docs/architecture.md): `regen.engine` is the job and never imports the rest;
`regen.console` is the Textual client of a running job; `regen.cli` is the `regen` command;
`regen.sim` the simulators the tests and the demo run against; `regen.demo` the bundled sample.
"""
