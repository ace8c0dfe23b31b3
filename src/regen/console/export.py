"""`e`: the snapshot on screen, written as JSON (all of it) and CSV (the providers pane's routes, datasets)."""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from regen.engine.schema import Snapshot, budget_lane

PROVIDER_COLUMNS = (
    "name",
    "slug",
    "status",
    "excluded",
    "requests",
    "ok",
    "share",
    "in_flight",
    "output_tokens",
    "output_tokens_per_s",
    "spent",
    "cost_per_m_output",
    "latency_p50_s",
    "latency_p95_s",
    "latency_p99_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "tpot_s",
    "errors",
)
DATASET_COLUMNS = (
    "name",
    "state",
    "total",
    "done",
    "ok",
    "truncated",
    "failed",
    "invalid",
    "in_flight",
    "output_tokens",
    "token_budget",
)


def _cell(value: object) -> object:
    if isinstance(value, dict):
        return ";".join(f"{k}={v}" for k, v in sorted(value.items()))
    return "" if value is None else value


def _write_csv(path: Path, columns: tuple[str, ...], rows: Sequence[Mapping[str, object]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(row.get(column)) for column in columns])


def export_snapshot(snap: Snapshot, folder: Path, now: float) -> list[Path]:
    """Write `regen-snapshot-<time>.json`, `…-providers.csv` and `…-datasets.csv`; returns the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"regen-snapshot-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}"
    whole = {k: v for k, v in snap.items() if k != "events"}
    json_path = folder / f"{stem}.json"
    json_path.write_text(json.dumps(whole, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    providers_path = folder / f"{stem}-providers.csv"
    _write_csv(providers_path, PROVIDER_COLUMNS, budget_lane(snap)["providers"])
    datasets_path = folder / f"{stem}-datasets.csv"
    _write_csv(datasets_path, DATASET_COLUMNS, snap["datasets"])
    return [json_path, providers_path, datasets_path]
