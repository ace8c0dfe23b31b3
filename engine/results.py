"""What a run writes: rows per dataset, the attempt journal and quarantine, each an append-only file.

The attempt journal's records are described in engine/recovery.py, which reads them back. A row and
its attempt's end record are committed together (two files, two group commits): a crash that keeps
only the row is settled from the row at the next start, one that keeps only the end record re-sends
the prompt with its first cost already counted. Either way no money is lost and no row is doubled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine.datasets import Dataset
from engine.jsonl import JsonlAppender

ATTEMPTS_FILE = "attempts.jsonl"
QUARANTINE_FILE = "quarantine.jsonl"


class ResultsWriter:
    """The run's durable files, opened once prepare() has checked everything."""

    def __init__(self) -> None:
        self._attempts: JsonlAppender | None = None
        self._quarantine: JsonlAppender | None = None
        self._rows: dict[str, JsonlAppender] = {}

    async def open(self, run_dir: Path, datasets: Mapping[str, Dataset], commit_interval_s: float) -> None:
        self._attempts = await JsonlAppender.open(run_dir / ATTEMPTS_FILE, commit_interval_s=commit_interval_s)
        self._quarantine = await JsonlAppender.open(
            run_dir / QUARANTINE_FILE, commit_interval_s=commit_interval_s
        )
        for name, dataset in datasets.items():
            self._rows[name] = await JsonlAppender.open(dataset.results_path, commit_interval_s=commit_interval_s)

    @property
    def attempts(self) -> JsonlAppender:
        assert self._attempts is not None, "the results writer is not open"
        return self._attempts

    def journal(self, record: Mapping[str, Any]) -> asyncio.Future[None]:
        """Append one attempt-journal record; the future resolves once it is on disk."""
        return self.attempts.append(record)

    async def commit_row(self, dataset: str, end: Mapping[str, Any], row: Mapping[str, Any]) -> None:
        """The attempt's end record and its row, durable together."""
        settled, written = self.attempts.append(end), self._rows[dataset].append(row)
        await settled
        await written

    async def quarantine(self, row: Mapping[str, Any]) -> None:
        assert self._quarantine is not None
        await self._quarantine.append(row)

    async def close(self) -> None:
        for writer in [*self._rows.values(), self._attempts, self._quarantine]:
            if writer is not None:
                await writer.close()
