"""What a run writes: rows per dataset, the attempt journal and quarantine, each an append-only file.

The attempt journal's records are engine/run/records.py (engine/run/recovery.py reads them back). A row and
its attempt's end record are committed together (two files, two group commits): a crash that keeps
only the row is settled from the row at the next start, one that keeps only the end record re-sends
the prompt with its first cost already counted. Either way no money is lost and no row is doubled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from regen.engine.data.datasets import Dataset
from regen.engine.data.jsonl import JsonlAppender, WriteFailed
from regen.engine.run.records import AttemptRecord, EndRecord

ATTEMPTS_FILE = "attempts.jsonl"
QUARANTINE_FILE = "quarantine.jsonl"


def _seen(future: asyncio.Future[None]) -> None:
    """A write nobody awaits: its failure is reported once, by the writer's on_failure."""
    if not future.cancelled():
        future.exception()


class ResultsWriter:
    """The run's durable files, opened once prepare() has checked everything.

    When a write fails (a full disk, EIO, a read-only remount: docs/faults.md), `on_failure` is
    told once with the file and the reason; from then on every write raises WriteFailed, and what
    is already on disk stays whole.
    """

    def __init__(self) -> None:
        self._attempts: JsonlAppender | None = None
        self._quarantine: JsonlAppender | None = None
        self._rows: dict[str, JsonlAppender] = {}
        self.failure: WriteFailed | None = None

    async def open(
        self,
        run_dir: Path,
        datasets: Mapping[str, Dataset],
        commit_interval_s: float,
        on_failure: Callable[[WriteFailed], None],
    ) -> None:
        def failed(exc: WriteFailed) -> None:
            if self.failure is None:
                self.failure = exc
                on_failure(exc)

        async def appender(path: Path) -> JsonlAppender:
            return await JsonlAppender.open(path, commit_interval_s=commit_interval_s, on_failure=failed)

        self._attempts = await appender(run_dir / ATTEMPTS_FILE)
        self._quarantine = await appender(run_dir / QUARANTINE_FILE)
        for name, dataset in datasets.items():
            self._rows[name] = await appender(dataset.results_path)

    @property
    def attempts(self) -> JsonlAppender:
        assert self._attempts is not None, "the results writer is not open"
        return self._attempts

    def journal(self, record: AttemptRecord) -> asyncio.Future[None]:
        """Append one attempt-journal record; the future resolves once it is on disk.

        Raises WriteFailed at once when the journal can no longer be written.
        """
        future = self.attempts.append(record)
        future.add_done_callback(_seen)
        return future

    def journal_nowait(self, record: AttemptRecord) -> int:
        """Append one record nobody waits for (a failure reaches on_failure); returns its ticket,
        for a later record that makes it redundant (`commit_row`'s `supersedes`)."""
        return self.attempts.append_nowait(record)

    def commit_row(
        self, dataset: str, end: EndRecord, row: Mapping[str, Any], supersedes: int | None = None
    ) -> Awaitable[object]:
        """The attempt's end record and its row, queued now (a record queued after this call is
        journaled after the end record) and durable together once the result is awaited.
        `supersedes`: the ticket of the attempt's `gen` record, which the end record (naming the
        same handle) replaces when it has not been written yet (engine/data/jsonl.py `supersede`):
        one line fewer per attempt that ends within one group commit of its handle."""
        attempts = self.attempts
        settled = attempts.append(end) if supersedes is None else attempts.supersede(supersedes, end)
        written = self._rows[dataset].append(row)
        # Not two awaits in turn: a caller cancelled while it waits for the first would leave the
        # second's failure (a writer stopped mid-batch) unretrieved, which asyncio logs as an error.
        return asyncio.gather(settled, written)

    async def quarantine(self, row: Mapping[str, Any]) -> None:
        assert self._quarantine is not None
        await self._quarantine.append(row)

    async def close(self) -> None:
        for writer in [*self._rows.values(), self._attempts, self._quarantine]:
            if writer is not None:
                # A failed writer has said why already; closing the others must still happen.
                with contextlib.suppress(WriteFailed):
                    await writer.close()
