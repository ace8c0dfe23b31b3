"""A run folder written record by record as a job writes it, and the check that a start from a
checkpoint rebuilt what a full read does (tests/engine/run/test_checkpoint.py, tests/engine/run/test_segments.py)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

from regen.engine.data.datasets import Dataset
from regen.engine.data.scan import ScanReport, scan
from regen.engine.data.validate import validate_line
from regen.engine.run.checkpoint import Checkpointer, Lane, Resumed
from regen.engine.run.records import end_record, gen_record, start_record
from regen.engine.run.recovery import DatasetProgress, JournalState, read_journals, read_rows

TS = 1_800_000_000.0
LANES = [Lane("openrouter", "openrouter", "openrouter", True)]


class Run:
    """A dataset, its rows and the two journals, written record by record as a job writes them."""

    def __init__(self, root: Path, prompts: int = 40) -> None:
        folder = root / "A"
        folder.mkdir()
        raws = [orjson.dumps({"messages": [{"role": "user", "content": f"q{n}"}]}) for n in range(prompts)]
        (folder / "prompts.jsonl").write_bytes(b"".join(r + b"\n" for r in raws))
        self.dataset = Dataset("A", folder)
        self.shas = [validate_line(r, "A", n).sha256 for n, r in enumerate(raws)]  # type: ignore[union-attr]
        self.run_dir = root / "run"
        self.run_dir.mkdir()
        self.attempts, self.events = self.run_dir / "attempts.jsonl", self.run_dir / "events.jsonl"
        self.tries: dict[int, int] = {}

    def journal(self, *records: Any) -> None:
        with self.attempts.open("ab") as f:
            f.write(b"".join(orjson.dumps(r) + b"\n" for r in records))

    def event(self, record: Any) -> None:
        with self.events.open("ab") as f:
            f.write(orjson.dumps(record) + b"\n")

    def row(self, line: int, status: str = "ok", ctok: int = 30) -> None:
        row = {"line": line, "prompt_sha256": self.shas[line], "status": status, "generation_id": f"g{line}",
               "usage": {"completion_tokens": ctok}, "cost": 0.0007, "backend": "openrouter"}  # fmt: skip
        with self.dataset.results_path.open("ab") as f:
            f.write(orjson.dumps(row) + b"\n")

    def rid(self, line: int) -> str:
        n = self.tries.get(line, 0)
        self.tries[line] = n + 1
        return f"A-{line:08d}#{n}"

    def answered(self, line: int, cost: str = "0.0007", *, est: bool = False, row: bool = True) -> None:
        rid = self.rid(line)
        self.journal(
            start_record(rid, "A", line, Decimal("0.01"), "openrouter", TS),
            gen_record(rid, f"g{line}"),
            end_record(rid, "A", line, f"g{line}", "openrouter", "ok", Decimal(cost), est, TS, ctok=30),
        )
        if row:
            self.row(line)

    def failed(self, line: int) -> None:
        rid = self.rid(line)
        self.journal(
            start_record(rid, "A", line, Decimal("0.01"), "openrouter", TS),
            end_record(
                rid,
                "A",
                line,
                None,
                "openrouter",
                "http_5xx",
                Decimal("0.0001"),
                False,
                TS,
                fields={"http": 502},
            ),
        )

    def open(self, line: int, *, gen: bool = True) -> str:
        rid = self.rid(line)
        self.journal(start_record(rid, "A", line, Decimal("0.02"), "openrouter", TS))
        if gen:
            self.journal(gen_record(rid, f"g{line}"))
        return rid

    def checkpointer(self) -> Checkpointer:
        return Checkpointer(self.run_dir, self.attempts, self.events, LANES, {"A": self.dataset.results_path})

    def prompts(self) -> dict[str, ScanReport]:
        return {"A": scan(self.dataset, keep_digests=True)}

    def full(self) -> tuple[JournalState, DatasetProgress]:
        """What a start without checkpoints rebuilds (engine/run/recovery.py, as it always read)."""
        state = read_journals(self.attempts, self.events, backend="openrouter", default="openrouter")
        crashed = {u.line for u in state.crashed}
        return state, read_rows(self.dataset.results_path, crashed, self.prompts()["A"])


def assert_same(resumed: Resumed, full: tuple[JournalState, DatasetProgress]) -> None:
    got, want = resumed.journals["openrouter"], full[0]
    assert got.spent == want.spent and isinstance(got.spent, Decimal)
    assert got.estimates == want.estimates
    assert vars(got.breakdown) == vars(want.breakdown)
    assert (got.crashed, got.to_reconcile, got.never_sent) == (
        want.crashed,
        want.to_reconcile,
        want.never_sent,
    )
    assert (got.excluded, got.first_start_ts, got.deadline, got.usage_base, got.begun) == (
        want.excluded, want.first_start_ts, want.deadline, want.usage_base, want.begun,
    )  # fmt: skip
    rows, want_rows = resumed.progress["A"], full[1]
    # Attempt counts: a checkpoint keeps those of unfinished prompts, all a start uses.
    unfinished = {line: n for line, n in want.attempts.get("A", {}).items() if line not in want_rows.done}
    assert got.attempts.get("A", {}) == unfinished
    assert rows.done == want_rows.done
    assert (rows.ok, rows.truncated, rows.output_tokens, rows.duplicates) == (
        want_rows.ok, want_rows.truncated, want_rows.output_tokens, want_rows.duplicates,
    )  # fmt: skip
    assert (rows.backend_rows, rows.backend_tokens) == (want_rows.backend_rows, want_rows.backend_tokens)
    for line in {u.line for u in want.crashed}:
        assert rows.settling.get(line) == want_rows.settling.get(line)
