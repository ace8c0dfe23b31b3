"""What a console received from real jobs, written down for the console's tests to replay.

`make recordings` (this module run as `python -m tests.support.recordings`) plays each kind of real
job of tests/support/real_jobs.py (OpenRouter, SGLang, both fleets: the simulators' failures staged,
the console's commands sent) and writes what its console received on the control socket to
tests/console/recordings/<kind>.jsonl.gz: a header line, then one line per message as it arrived
(`{"at": epoch seconds, "hello" | "snapshot" | "bye": ...}`) and per command with the job's reply
(`{"at", "command": {"name", "args"}, "reply": {"ok", "message"}}`). tests/support/replay.py plays
them back; tests/console/test_recordings.py checks them against engine/schema.py.

After recording again, update the screenshots (`pytest tests/console/test_snapshots.py
--snapshot-update`) and look at every one that changed.
"""

from __future__ import annotations

import asyncio
import gzip
import shutil
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import orjson

from regen.engine.control.server import PROTOCOL_VERSION
from regen.engine.schema import Snapshot
from tests.support.real_jobs import KINDS, play

FOLDER = Path(__file__).resolve().parent.parent / "console" / "recordings"


@dataclass(frozen=True)
class Recording:
    """One real job as its console saw it."""

    kind: str
    header: dict[str, Any]
    hello: dict[str, Any]
    entries: tuple[dict[str, Any], ...]  # every line after the hello, in order

    def snapshots(self) -> list[Snapshot]:
        return [entry["snapshot"] for entry in self.entries if "snapshot" in entry]

    def commands(self) -> list[dict[str, Any]]:
        return [entry for entry in self.entries if "command" in entry]


def path(kind: str) -> Path:
    return FOLDER / f"{kind}.jsonl.gz"


@cache
def load(kind: str) -> Recording:
    """A recording as written (cached: the tests copy what they change)."""
    lines = [orjson.loads(line) for line in gzip.decompress(path(kind).read_bytes()).splitlines()]
    header, first, *rest = lines
    return Recording(kind, header, first["hello"], tuple(rest))


def write(kind: str, lines: list[dict[str, Any]], notes: list[str]) -> Path:
    header = {"recording": kind, "protocol": PROTOCOL_VERSION, "by": "make recordings", "staged": notes}
    body = b"".join(orjson.dumps(line) + b"\n" for line in [header, *lines])
    target = path(kind)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(gzip.compress(body, 9, mtime=0))
    return target


async def record(kind: str) -> Path:
    # A fixed folder: the job's run folder is in its hello, and the screenshots show it.
    root = Path(tempfile.gettempdir()) / f"regen-recording-{kind}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    try:
        run = await play(kind, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lines = [{"at": round(got.at, 3), **got.message} for got in run.console.lines]
    return write(kind, lines, run.notes)


def main(argv: list[str]) -> int:
    kinds = argv or list(KINDS)
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        print(f"unknown recording {', '.join(unknown)}; known: {', '.join(KINDS)}", file=sys.stderr)
        return 2
    for kind in kinds:
        written = asyncio.run(record(kind))
        print(f"{written}: {len(load.__wrapped__(kind).entries)} lines")
    print("now: pytest tests/console/test_snapshots.py --snapshot-update, and look at every SVG that changed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
