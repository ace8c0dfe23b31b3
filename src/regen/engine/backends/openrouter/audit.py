"""`regen audit`: the canary audit (docs/fidelity.md, "The canary audit").

A small seeded sample of the job's own prompts, at temperature 0 with a fixed seed, sent to each
allowed provider alone (`provider.only`, no fallbacks) and to each SGLang server of `sglang.urls`; the
answers compared in the target tokenizer's ids with the servers' answer of each prompt (the target's
own weights), or the majority's when there are no servers. The plan (what it costs at worst) is made before anything
is sent and must fit in what `job.budget_usd` has left; what it spent is journaled in attempts.jsonl
(outcome `audit`), so the next run's ledger counts it.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from regen.engine.backends.openrouter.catalog import (
    Endpoint,
    allowed_endpoints,
    fetch_endpoint_table,
    routing_of,
)
from regen.engine.backends.openrouter.client import OpenRouterClient
from regen.engine.backends.sglang.audit import fleet_answers
from regen.engine.config.settings import ProviderSettings, Settings
from regen.engine.data.datasets import Prompt, discover
from regen.engine.data.idcompare import common_prefix, majority, similarity
from regen.engine.data.jsonl import repair_torn_tail
from regen.engine.data.scan import iter_prompts
from regen.engine.money.ledger import to_dollars
from regen.engine.run.records import end_record
from regen.engine.run.recovery import read_journals

AUDIT_DATASET = "(audit)"  # the journal's dataset name for the audit's attempts: no dataset has it
# Below this mean similarity to the majority, a provider's answers are not the same model's.
SIMILAR = 0.6


@dataclass(frozen=True, slots=True)
class AuditPlan:
    providers: list[Endpoint]
    prompts: list[Prompt]
    max_tokens: int
    seed: int
    worst_usd: Decimal
    budget_left_usd: Decimal

    @property
    def fits(self) -> bool:
        return self.worst_usd <= self.budget_left_usd

    def describe(self) -> str:
        return (
            f"audit: {len(self.prompts)} prompts x {len(self.providers)} providers at temperature 0, seed {self.seed}, "
            f"max_tokens {self.max_tokens}: at most ${self.worst_usd:.4f} of ${self.budget_left_usd:.4f} left "
            "in job.budget_usd"
        )


def sample_prompts(settings: Settings, n: int, seed: int) -> list[Prompt]:
    """`n` of the datasets' valid prompts, the same ones for the same seed (a reservoir: one pass)."""
    rng = random.Random(seed)
    chosen: list[Prompt] = []
    seen = 0
    for dataset in discover(settings.job.datasets, settings.job.dataset_roots):
        for prompt in iter_prompts(dataset):
            seen += 1
            if len(chosen) < n:
                chosen.append(prompt)
            elif (slot := rng.randrange(seen)) < n:
                chosen[slot] = prompt
    return sorted(chosen, key=lambda p: (p.dataset, p.line))


def _prompt_tokens(prompt: Prompt) -> int:
    # A bound, not a count: a token is at least one byte of the request's messages.
    return len(orjson.dumps(prompt.request_messages))


async def plan_audit(settings: Settings, prompts: int, seed: int, max_tokens: int) -> AuditPlan:
    journal = await asyncio.to_thread(
        read_journals, settings.job.run_dir / "attempts.jsonl", settings.job.run_dir / "events.jsonl"
    )
    client = OpenRouterClient(settings.openrouter, pool_size=2, routing=routing_of(settings.openrouter))
    await client.open()
    try:
        endpoints, _ = await fetch_endpoint_table(client, settings.openrouter.model)
    finally:
        await client.close()
    routing = routing_of(settings.openrouter)
    providers = allowed_endpoints(endpoints, routing, journal.excluded, max_tokens)
    chosen = await asyncio.to_thread(sample_prompts, settings, prompts, seed)
    worst = sum(
        (
            e.prompt_price * _prompt_tokens(p) + e.completion_price * max_tokens
            for e in providers
            for p in chosen
        ),
        Decimal(0),
    )
    left = to_dollars(settings.job.budget_usd) - journal.spent
    return AuditPlan(providers, chosen, max_tokens, seed, worst, left)


async def run_audit(
    settings: Settings, plan: AuditPlan, encode: Callable[[str], list[int]]
) -> dict[str, Any]:
    """Send the plan's requests, journal their money, compare the answers; the report."""
    sampling = settings.openrouter.model_copy(
        update={"temperature": 0.0, "max_tokens": plan.max_tokens, "stream": False}
    )
    answers: dict[str, list[list[int] | None]] = {}
    records = []
    spent = Decimal(0)
    for endpoint in plan.providers:
        alone = ProviderSettings(only=[endpoint.slug], allow_fallbacks=False, sort=None)
        client = OpenRouterClient(sampling, pool_size=len(plan.prompts) or 1, routing=alone, seed=plan.seed)
        await client.open()
        try:
            results = await asyncio.gather(*(client.complete(p.request_messages, ()) for p in plan.prompts))
        finally:
            await client.close()
        ids: list[list[int] | None] = []
        for i, (prompt, result) in enumerate(zip(plan.prompts, results, strict=True)):
            worst = (
                endpoint.prompt_price * _prompt_tokens(prompt) + endpoint.completion_price * plan.max_tokens
            )
            cost = (
                Decimal(str(result.cost))
                if result.cost is not None
                else (worst if result.http_status else Decimal(0))
            )
            spent += cost
            records.append(
                end_record(
                    f"audit-{int(time.time())}-{endpoint.slug}-{i}",
                    AUDIT_DATASET,
                    i,
                    result.generation_id,
                    "openrouter",
                    "audit",
                    cost,
                    result.cost is None and result.http_status is not None,
                    time.time(),
                    provider=result.provider or endpoint.provider_name,
                )
            )
            ids.append(
                None if result.error is not None else encode(result.reasoning) + encode(result.content)
            )
        answers[endpoint.provider_name] = ids
    await asyncio.to_thread(_journal, settings.job.run_dir / "attempts.jsonl", records)
    fleet = await fleet_answers(settings, plan.prompts, plan.max_tokens, encode)
    report = compare({**answers, **fleet}, len(plan.prompts), reference=set(fleet))
    return {**report, "spent_usd": float(spent), "plan_usd": float(plan.worst_usd)}


def _journal(path: Path, records: list[Any]) -> None:
    if not records:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    repair_torn_tail(path)
    with open(path, "ab") as f:
        f.write(b"".join(orjson.dumps(r) + b"\n" for r in records))
        f.flush()
        os.fsync(f.fileno())


def compare(
    answers: dict[str, list[list[int] | None]], prompts: int, reference: set[str] | None = None
) -> dict[str, Any]:
    """Each provider against each prompt's reference answer: the majority of the `reference` sources
    (the GPU fleet's servers) when they answered, else of all. Common prefix and similarity in ids."""
    per: dict[str, dict[str, list[float]]] = {name: {"prefix": [], "similarity": []} for name in answers}
    trusted = reference or set()
    for i in range(prompts):
        given = [(name, ids[i]) for name, ids in answers.items() if ids[i] is not None]
        pool = [(name, ids) for name, ids in given if name in trusted] or given
        ref = majority([ids for _, ids in pool if ids is not None])
        if ref is None:
            continue
        reference_ids = pool[ref][1]
        assert reference_ids is not None
        for name, ids in given:
            assert ids is not None
            per[name]["prefix"].append(common_prefix(ids, reference_ids))
            per[name]["similarity"].append(similarity(ids, reference_ids))
    providers = []
    for name, figures in per.items():
        sims = figures["similarity"]
        mean = statistics.fmean(sims) if sims else None
        providers.append(
            {
                "provider": name,
                "answers": len(sims),
                "prefix_median": statistics.median(figures["prefix"]) if sims else None,
                "similarity_mean": mean,
                "verdict": "no answers" if mean is None else ("differs" if mean < SIMILAR else "same"),
            }
        )
    return {"reference": "sglang" if trusted else "majority", "providers": providers}
