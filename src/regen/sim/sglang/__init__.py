"""The SGLang simulator: SGLang's native HTTP API, its scheduler's load behaviour, its log and its
failures, on loopback and without a GPU (docs/sglang.md).

Its modules are imported by name (regen.sim.sglang.server, .runner, .launch, ...); this package
imports none of them, so the stand-in launcher's `--help` and its refusals (regen.sim.sglang.launch,
run on a host at every preflight) do not load the HTTP server and aiohttp first.
"""
