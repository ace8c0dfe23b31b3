"""The canary audit's reference (docs/fidelity.md, "The canary audit"): the GPU fleet's own servers,
each asked alone, at temperature 0, through the SGLang backend itself (one backend per server URL)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from regen.engine.backends.base import Standalone
from regen.engine.backends.sglang.backend import SGLangBackend
from regen.engine.config.settings import Settings
from regen.engine.data.datasets import Prompt


def _ignore(_: str | None) -> None:
    pass


async def fleet_answers(
    settings: Settings, prompts: Sequence[Prompt], max_tokens: int, encode: Callable[[str], list[int]]
) -> dict[str, list[list[int] | None]]:
    """Each server of the GPU fleet (when the job has the SGLang backend) and its answers in ids:
    the servers of `sglang.urls`, or each [[hosts]] server through the tunnels a backend opens for
    the whole fleet (each asked alone, past the router); empty without servers."""
    if "sglang" not in settings.job.chosen_backends:
        return {}
    greedy = settings.model_copy(
        update={
            "openrouter": settings.openrouter.model_copy(
                update={"temperature": 0.0, "max_tokens": max_tokens}
            )
        }
    )
    if settings.sglang.urls:
        servers = {url: url.split("://", 1)[-1] for url in settings.sglang.urls}
        return await _ask_each(greedy, servers, prompts, encode)
    if not settings.hosts:
        return {}
    fleet = SGLangBackend(greedy)  # holds the SSH connections and tunnels while each server is asked
    fleet.check()
    await fleet.open(Standalone())
    try:
        servers = {worker.url: worker.name for worker in fleet.workers}
        return await _ask_each(greedy, servers, prompts, encode)
    finally:
        await fleet.close()


async def _ask_each(
    settings: Settings,
    servers: dict[str, str],
    prompts: Sequence[Prompt],
    encode: Callable[[str], list[int]],
) -> dict[str, list[list[int] | None]]:
    """`servers` (url -> name), each through a backend of its own holding that url alone."""
    answers: dict[str, list[list[int] | None]] = {}
    for url, name in servers.items():
        alone = settings.model_copy(update={"sglang": settings.sglang.model_copy(update={"urls": [url]})})
        backend = SGLangBackend(alone)
        backend.check()
        await backend.open(Standalone())
        try:
            ids: list[list[int] | None] = []
            for i, prompt in enumerate(prompts):
                outcome = await backend.attempt(prompt, f"audit-{i}", _ignore, _ignore)
                ids.append(
                    None
                    if outcome.failure is not None
                    else encode(outcome.reasoning) + encode(outcome.content)
                )
        finally:
            await backend.close()
        answers[f"sglang {name}"] = ids
    return answers
