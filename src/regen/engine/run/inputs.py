"""The run's inputs: datasets found and every line checked, and the rows earlier runs wrote.

Every line of every selected dataset is validated before the first request (docs/data-contract.md
§1). A row whose prompt changed under it means the input file was edited: the job stops rather
than guess which of the two is right.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

from regen.engine.config.settings import JobSettings
from regen.engine.data.datasets import Dataset, DatasetError, discover
from regen.engine.data.scan import ScanReport
from regen.engine.data.scancache import cached_scan
from regen.engine.money.ledger import planning_prompt_tokens
from regen.engine.run.recovery import DatasetProgress
from regen.engine.run.state import DatasetState, JobError

# Invalid lines listed per dataset before "and N more".
SHOWN_INVALID = 20


@dataclass(frozen=True, slots=True)
class Scanned:
    dataset: Dataset
    report: ScanReport
    # Keeps the scan in the run folder (engine/data/scancache.py), once the job holds it; None: kept already.
    keep: Callable[[], None] | None = None


async def scan_datasets(job: JobSettings, only: Collection[str] | None, skip_invalid: bool) -> list[Scanned]:
    """The datasets the settings select, each scanned whole; JobError names every bad line."""
    if not job.datasets and not job.dataset_roots:
        raise JobError("no datasets: set job.datasets or job.dataset_roots in the settings file")
    try:
        found = discover(job.datasets, job.dataset_roots, only)
    except DatasetError as exc:
        raise JobError(str(exc)) from None
    if not found:
        raise JobError("the dataset roots hold no dataset (no subfolder with prompts.jsonl)")
    scanned = []
    problems = []
    for dataset in found:
        # Kept in the run folder under the file's identity: an unchanged file is not validated again.
        report, keep = await asyncio.to_thread(cached_scan, dataset, job.run_dir)
        scanned.append(Scanned(dataset, report, keep))
        for bad in report.invalid[:SHOWN_INVALID]:
            problems.append(f"{dataset.prompts_path}:{bad.line + 1}: {bad.reason}")
        if len(report.invalid) > SHOWN_INVALID:
            problems.append(
                f"{dataset.prompts_path}: and {len(report.invalid) - SHOWN_INVALID} more invalid lines"
            )
    if problems and not skip_invalid:
        raise JobError("invalid prompt lines (fix them or pass --skip-invalid):\n" + "\n".join(problems))
    return scanned


def load_progress(
    scanned: Iterable[Scanned], progress: Mapping[str, DatasetProgress], token_budget: int | None
) -> dict[str, DatasetState]:
    """Each dataset's live state, from its rows (read and checked against the prompts by
    engine/run/checkpoint.py); JobError when a row does not match its prompt."""
    states = {}
    for item in scanned:
        dataset, report = item.dataset, item.report
        rows = progress[dataset.name]
        check_rows_match(dataset, rows)
        states[dataset.name] = DatasetState(
            dataset,
            report.total,
            len(report.invalid),
            rows,
            token_budget=token_budget,
            prompt_tokens_mean=planning_prompt_tokens(report.content_chars),
        )
    return states


def check_rows_match(dataset: Dataset, progress: DatasetProgress) -> None:
    """Every row names a valid line whose prompt is still the one it was written for.

    read_rows(prompts=...) compared each row with the digest the scan kept (scan(keep_digests=True))
    as it read it: no second pass over either file.
    """
    if progress.changed is not None:
        raise JobError(
            f"{dataset.prompts_path}:{progress.changed + 1}: prompt changed since its row was written "
            f"(row in {dataset.results_path.name} has another prompt_sha256); restore the file or "
            "move the results away"
        )
    if progress.orphans:
        first = min(progress.orphans)
        raise JobError(
            f"{dataset.results_path}: {len(progress.orphans)} rows name lines that are not valid prompts "
            f"in {dataset.prompts_path.name} (first: line {first + 1})"
        )


async def keep_scans(scanned: Iterable[Scanned]) -> None:
    """Each new scan kept in the run folder, for the next start (the job holds the folder now)."""
    for item in scanned:
        if item.keep is not None:
            await asyncio.to_thread(item.keep)
