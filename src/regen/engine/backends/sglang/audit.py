"""The canary audit's reference (docs/fidelity.md, "The canary audit"): the GPU fleet's own servers,
each asked alone, at temperature 0, through the SGLang backend itself (one backend per server URL)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

from regen.engine.backends.sglang.backend import SGLangBackend
from regen.engine.config.settings import Settings
from regen.engine.data.datasets import Prompt


class _Alone:
    """The job context of a backend opened for the audit alone: nothing to steer, no budget."""

    live = True

    def event(self, name: str, /, **fields: Any) -> None:
        pass

    def fatal(self, reason: str, message: str) -> None:
        pass

    def budget_left(self) -> Decimal:
        return Decimal("Infinity")

    def suggest_concurrency(self, ceiling: int | None, reason: str) -> None:
        pass

    def answered(self, generation: bool) -> None:
        pass

    async def reachable(self) -> None:
        return None


def _ignore(_: str | None) -> None:
    pass


async def fleet_answers(
    settings: Settings, prompts: Sequence[Prompt], max_tokens: int, encode: Callable[[str], list[int]]
) -> dict[str, list[list[int] | None]]:
    """Each server of `sglang.urls` (when the job has the SGLang backend) and its answers in ids;
    empty without servers named there (a fleet reached through [[hosts]] tunnels is not asked yet)."""
    if "sglang" not in settings.job.chosen_backends or not settings.sglang.urls:
        return {}
    answers: dict[str, list[list[int] | None]] = {}
    for url in settings.sglang.urls:
        alone = settings.model_copy(
            update={
                "openrouter": settings.openrouter.model_copy(update={"temperature": 0.0, "max_tokens": max_tokens}),
                "sglang": settings.sglang.model_copy(update={"urls": [url]}),
            }
        )
        backend = SGLangBackend(alone)
        backend.check()
        await backend.open(_Alone())
        try:
            ids: list[list[int] | None] = []
            for i, prompt in enumerate(prompts):
                outcome = await backend.attempt(prompt, f"audit-{i}", _ignore, _ignore)
                ids.append(None if outcome.failure is not None else encode(outcome.reasoning) + encode(outcome.content))
        finally:
            await backend.close()
        answers[f"sglang {url.split('://', 1)[-1]}"] = ids
    return answers
