"""`regen catalog`: every endpoint of the model, allowed or excluded with the reason, and the budget plan."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from regen.engine.backends.openrouter.account import generation_cost
from regen.engine.backends.openrouter.catalog import (
    CatalogError,
    Endpoint,
    fetch_endpoint_table,
    routing_of,
    verdict,
)
from regen.engine.backends.openrouter.client import OpenRouterClient
from regen.engine.config.settings import Settings
from regen.engine.data.datasets import DatasetError, discover
from regen.engine.data.scan import scan
from regen.engine.money.ledger import PER_MILLION, planning_prompt_tokens, to_dollars
from regen.engine.money.planner import DatasetNeed, plan, remaining_output_tokens
from regen.engine.run.recovery import Unsettled, read_journals, read_rows

# How long `regen catalog` looks up the bills a run left estimated, so it plans with what was billed.
BILLS_LOOKUP_S = 5.0


def _p50(value: Any) -> Any:
    return value.get("p50") if isinstance(value, dict) else value


def endpoint_rows(
    endpoints: list[Endpoint], raw: list[dict[str, Any]], settings: Settings, excluded: Mapping[str, str]
) -> list[dict[str, Any]]:
    routing = routing_of(settings.openrouter)
    rows = []
    for endpoint, item in zip(endpoints, raw, strict=True):
        allowed, _, reason = verdict(endpoint, routing, excluded, settings.openrouter.max_tokens)
        rows.append(
            {
                "provider": endpoint.provider_name,
                "tag": endpoint.tag,
                "slug": endpoint.slug,
                "quantization": endpoint.quantization,
                "prompt_usd_per_m": float(endpoint.prompt_price * PER_MILLION),
                "completion_usd_per_m": float(endpoint.completion_price * PER_MILLION),
                "context_length": endpoint.context_length,
                "max_completion_tokens": endpoint.max_completion_tokens,
                "status": endpoint.status,
                "uptime_30m": item.get("uptime_last_30m"),
                "latency_p50": _p50(item.get("latency_last_30m")),
                "throughput_p50": _p50(item.get("throughput_last_30m")),
                "allowed": allowed,
                "reason": reason,
            }
        )
    return rows


def dataset_needs(settings: Settings) -> tuple[list[DatasetNeed], list[dict[str, Any]]]:
    """Remaining work per dataset of the settings, measured from finished rows where there are some."""
    job = settings.job
    if not job.datasets and not job.dataset_roots:
        return [], []
    needs, views = [], []
    for dataset in discover(job.datasets, job.dataset_roots, None):
        report = scan(dataset)
        progress = read_rows(dataset.results_path)
        done = len(progress.done)
        remaining = max(0, report.valid - done)
        per_prompt = progress.output_tokens / done if done else float(settings.expected_output_tokens)
        prompt_tokens = planning_prompt_tokens(report.content_chars)
        output = remaining_output_tokens(
            remaining, per_prompt, progress.output_tokens, job.dataset_token_budget
        )
        needs.append(DatasetNeed(dataset.name, remaining, output, int(remaining * prompt_tokens)))
        views.append(
            {
                "name": dataset.name,
                "prompts": report.valid,
                "done": done,
                "remaining": remaining,
                "output_tokens_per_prompt": per_prompt,
                "measured": bool(done),
                "remaining_output_tokens": output,
            }
        )
    return needs, views


async def billed_instead(client: OpenRouterClient, pending: list[Unsettled], within_s: float) -> Decimal:
    """How much less than their estimates the bills of `pending` came to, for those /generation
    names within `within_s` (the rest stay at their estimate); nothing is journaled here: the
    job's next start settles them for good."""

    async def nothing() -> None:
        return None

    async def one(unsettled: Unsettled) -> Decimal:
        assert unsettled.generation_id is not None
        billed = await generation_cost(client, unsettled.generation_id, within_s, nothing)
        return Decimal(0) if billed is None else unsettled.estimate - billed

    tasks = [asyncio.ensure_future(one(u)) for u in pending if u.generation_id]
    if not tasks:
        return Decimal(0)
    done, late = await asyncio.wait(tasks, timeout=within_s)
    for task in late:
        task.cancel()
    await asyncio.gather(*late, return_exceptions=True)
    return sum((task.result() for task in done if task.exception() is None), Decimal(0))


async def build_catalog(settings: Settings) -> dict[str, Any]:
    """The whole catalog report; raises CatalogError or DatasetError with the operator's message."""
    journal = await asyncio.to_thread(
        read_journals, settings.job.run_dir / "attempts.jsonl", settings.job.run_dir / "events.jsonl"
    )
    client = OpenRouterClient(settings.openrouter, pool_size=4, routing=routing_of(settings.openrouter))
    await client.open()
    try:
        endpoints, raw = await fetch_endpoint_table(client, settings.openrouter.model)
        # The plan is made with the money really left: bills a run left estimated, looked up now.
        spent = journal.spent - await billed_instead(client, journal.to_reconcile, BILLS_LOOKUP_S)
    finally:
        await client.close()
    rows = endpoint_rows(endpoints, raw, settings, journal.excluded)
    allowed = [e.price for e, row in zip(endpoints, rows, strict=True) if row["allowed"]]
    needs, datasets = await asyncio.to_thread(dataset_needs, settings)
    budget_left = to_dollars(settings.job.budget_usd) - spent
    return {
        "model": settings.openrouter.model,
        "allowed_precisions": routing_of(settings.openrouter).quantizations,
        "endpoints": rows,
        "datasets": datasets,
        "spent": float(spent),
        "budget": settings.job.budget_usd,
        "plan": plan(needs, allowed, budget_left) if needs else None,
    }


def format_catalog(report: dict[str, Any]) -> list[str]:
    precisions = report["allowed_precisions"]
    lines = [
        f"{report['model']}: {len(report['endpoints'])} endpoints; allowed precisions: "
        + (", ".join(precisions) if precisions else "any"),
        "",
        f"{'':2}{'provider':<16}{'tag':<18}{'quant':<8}{'$/M in':>8}{'$/M out':>9}{'context':>9}{'max out':>9}"
        f"{'status':>7}{'uptime':>8}{'ttft':>7}{'tok/s':>7}  verdict",
    ]
    for row in sorted(report["endpoints"], key=lambda r: (not r["allowed"], r["completion_usd_per_m"])):
        mark = "+ " if row["allowed"] else "- "
        uptime = "-" if row["uptime_30m"] is None else f"{row['uptime_30m']:.1f}%"
        latency = "-" if row["latency_p50"] is None else f"{row['latency_p50']:.2f}"
        speed = "-" if row["throughput_p50"] is None else f"{row['throughput_p50']:.0f}"
        verdict = (
            "allowed"
            if row["allowed"] and row["reason"] is None
            else ("allowed: " if row["allowed"] else "excluded: ") + str(row["reason"] or "")
        )
        lines.append(
            f"{mark}{row['provider'][:15]:<16}{row['tag'][:17]:<18}{row['quantization']:<8}"
            f"{row['prompt_usd_per_m']:>8.2f}{row['completion_usd_per_m']:>9.2f}"
            f"{row['context_length'] or '-':>9}{row['max_completion_tokens'] or '-':>9}{row['status']:>7}"
            f"{uptime:>8}{latency:>7}{speed:>7}  {verdict}"
        )
    plan_view = report.get("plan")
    if plan_view is None:
        lines += ["", "budget plan: no datasets in the settings"]
        return lines
    lines += ["", f"budget plan (${report['budget']:.2f} budget, ${report['spent']:.2f} spent):"]
    for d in report["datasets"]:
        basis = "measured" if d["measured"] else "assumed"
        lines.append(
            f"  {d['name']}: {d['remaining']} of {d['prompts']} prompts left, {d['output_tokens_per_prompt']:.0f} "
            f"output tokens each ({basis}), {d['remaining_output_tokens']:,} tokens to go"
        )
    if plan_view.get("fits") is None:
        lines.append(f"  {plan_view.get('reason')}")
        return lines
    for level in ("cheapest", "median", "dearest"):
        cost = plan_view["cost"][level]
        lines.append(f"  at the {level} allowed provider ({cost['provider']}): ${cost['usd']:,.2f}")
    if plan_view["fits"]:
        lines.append("  fits the budget")
    else:
        ways = plan_view["ways_out"]
        lines.append(
            f"  does not fit: over by ${plan_view['over_by_usd']:,.2f} at the cheapest provider; either"
        )
        lines.append(f"    - {ways['token_budget']['text']}, or")
        lines.append(f"    - {ways['run_until_spent']['text']}")
    return lines


__all__ = ["CatalogError", "DatasetError", "build_catalog", "format_catalog"]
