"""Every line of one ``prompts.jsonl`` checked in bounded memory, in parallel: `regen inspect` on the host.

This runs on the GPU host, shipped on stdin with ``engine/data/datasets.py``, ``lines.py`` and
``validate.py`` (standard library only; orjson when the host has it). The rules are the job's, line
for line (``check_line`` and ``read_lines``); what differs from ``engine/data/scan.py`` is what is
kept, so memory stays bounded whatever the file size (docs/gpu-host.md, "Inspecting in bounded memory"):

- invalid lines: the first ``INVALID_CAP`` are listed, the rest only counted (per kind too);
- content lengths: a histogram, exact below ``EXACT_BELOW`` characters and to 12 significant bits
  above (an error under 0.05%), instead of one number per prompt;
- duplicates: a 64-bit hash of each prompt's canonical bytes goes to one of many partitions by its
  low bits; partitions spill to a temporary folder when too many are held, and are counted one at
  a time at the end, so no more than ``PART_TARGET`` hashes are in a set at once;
- extra top-level keys: at most ``EXTRA_KEYS_CAP`` names, the rest counted together.

A large file is cut at line boundaries into ranges that forked workers check at once while this
process hashes the whole file; a dataset's line numbers and sha256 are the same as one pass gives.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from regen.engine.data.datasets import RESULTS_FILE
from regen.engine.data.lines import read_lines
from regen.engine.data.validate import check_line, reason_kind

try:
    import orjson

    _loads: Any = orjson.loads
except ImportError:  # pragma: no cover - hosts without orjson
    import json

    _loads = json.loads

INVALID_CAP = 1000
KIND_SAMPLES = 5
EXTRA_KEYS_CAP = 64
EXACT_BELOW = 4096
SIGNIFICANT_BITS = 12
# At most this many hashes in one set when duplicates are counted.
PART_TARGET = 1 << 19
# Hashes held in memory across all partitions before they are written out.
BUFFERED_CAP = 1 << 20
# The shortest valid line, {"messages":[{"role":"user","content":""}]}, bounds the prompts a file holds.
SHORTEST_LINE = 45
MAX_PARTS = 4096
# Below this a file is checked in this process; forking costs more than it saves.
PARALLEL_MIN_BYTES = 16 << 20
MAX_WORKERS = 8
_CHUNK = 1 << 20


def default_workers() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cpus))


# ---------------------------------------------------------------------------------------------
# Content lengths


def length_bucket(value: int) -> int:
    """The histogram bucket of a length: itself below EXACT_BELOW, else its top 12 bits."""
    if value < EXACT_BELOW:
        return value
    shift = value.bit_length() - SIGNIFICANT_BITS
    return (value >> shift) << shift


class LengthHistogram:
    """Counts of content lengths; at most 2048 buckets per power of two above EXACT_BELOW."""

    __slots__ = ("large", "small")

    def __init__(self) -> None:
        self.small = [0] * EXACT_BELOW
        self.large: dict[int, int] = {}

    def add_large(self, value: int) -> None:
        bucket = length_bucket(value)
        self.large[bucket] = self.large.get(bucket, 0) + 1

    def merge(self, other: LengthHistogram) -> None:
        small = self.small
        for i, count in enumerate(other.small):
            if count:
                small[i] += count
        for bucket, count in other.large.items():
            self.large[bucket] = self.large.get(bucket, 0) + count

    @property
    def count(self) -> int:
        return sum(self.small) + sum(self.large.values())

    @property
    def exact(self) -> bool:
        """Whether every length was counted exactly (none reached EXACT_BELOW)."""
        return not self.large

    def percentiles(self, ps: Sequence[int] = (50, 90, 99)) -> dict[str, int]:
        """Nearest-rank percentiles, as ``ScanReport.content_chars_percentiles`` defines them."""
        total = self.count
        if not total:
            return {f"p{p}": 0 for p in ps}
        ranks = {p: min(total, max(1, math.ceil(p / 100 * total))) for p in ps}
        out: dict[str, int] = {}
        seen = 0
        buckets = [(v, c) for v, c in enumerate(self.small) if c] + sorted(self.large.items())
        pending = sorted(ps, key=lambda p: ranks[p])
        for value, count in buckets:
            seen += count
            while pending and ranks[pending[0]] <= seen:
                out[f"p{pending.pop(0)}"] = value
            if not pending:
                break
        return {f"p{p}": out[f"p{p}"] for p in ps}

    def to_state(self) -> tuple[list[tuple[int, int]], dict[int, int]]:
        return [(v, c) for v, c in enumerate(self.small) if c], self.large

    @classmethod
    def from_state(cls, state: tuple[list[tuple[int, int]], dict[int, int]]) -> LengthHistogram:
        hist = cls()
        for value, count in state[0]:
            hist.small[value] = count
        hist.large = dict(state[1])
        return hist


# ---------------------------------------------------------------------------------------------
# Duplicates


def partitions_for(size: int) -> int:
    """Partitions (a power of two) so that none holds more than PART_TARGET of the file's prompts."""
    most = size // SHORTEST_LINE + 1
    parts = 1
    while parts * PART_TARGET < most and parts < MAX_PARTS:
        parts *= 2
    return parts


class DigestSpill:
    """Hashes of valid prompts, partitioned by their low bits, written out when too many are held.

    Files are ``<folder>/<tag>-<partition>.q``: native 8-byte integers, appended to at each flush.
    Without a folder, the first flush makes a temporary one under ``base`` (the system's default
    when None); ``remove()`` deletes what this spill made.
    """

    __slots__ = ("base", "buffered", "buffers", "folder", "made", "mask", "parts", "tag", "written")

    def __init__(self, parts: int, folder: str | None, tag: str, base: str | None = None) -> None:
        self.parts = parts
        self.mask = parts - 1
        self.folder = folder
        self.base = base
        self.made = False
        self.tag = tag
        self.buffers = [array("q") for _ in range(parts)]
        self.buffered = 0
        self.written = False

    def path(self, part: int) -> str:
        assert self.folder is not None
        return os.path.join(self.folder, f"{self.tag}-{part}.q")

    def flush(self) -> None:
        if self.folder is None:
            self.folder = tempfile.mkdtemp(prefix="regen-inspect-", dir=self.base)
            self.made = True
        for part, buf in enumerate(self.buffers):
            if buf:
                with open(self.path(part), "ab") as f:
                    buf.tofile(f)
                self.buffers[part] = array("q")
        self.buffered = 0
        self.written = True

    def remove(self) -> None:
        if self.made and self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def chunks(self, part: int) -> Iterator[array[int]]:
        """Every hash of one partition: from its file, then from memory."""
        if self.written:
            try:
                f = open(self.path(part), "rb")  # noqa: SIM115 - closed below, read in blocks
            except FileNotFoundError:
                pass
            else:
                with f:
                    while True:
                        block = array("q")
                        try:
                            block.fromfile(f, PART_TARGET)
                        except EOFError:
                            if block:
                                yield block
                            break
                        yield block
        if self.buffers[part]:
            yield self.buffers[part]


def count_distinct(spills: Sequence[DigestSpill]) -> int:
    """Distinct hashes over all spills, one partition in memory at a time."""
    total = 0
    parts = spills[0].parts if spills else 0
    for part in range(parts):
        seen: set[int] = set()
        for spill in spills:
            for block in spill.chunks(part):
                seen.update(block)
        total += len(seen)
    return total


# ---------------------------------------------------------------------------------------------
# One range of lines


class _Window:
    """A file read from ``start`` up to ``end`` only, for ``read_lines``."""

    __slots__ = ("f", "left")

    def __init__(self, f: Any, start: int, end: int) -> None:
        f.seek(start)
        self.f = f
        self.left = end - start

    def read(self, n: int) -> bytes:
        if self.left <= 0:
            return b""
        data: bytes = self.f.read(min(n, self.left))
        self.left -= len(data)
        return data

    def __enter__(self) -> _Window:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


def _check_range(path: str, start: int, end: int, spill: DigestSpill) -> dict[str, Any]:
    """Check the lines in bytes [start, end) of ``path``; line numbers are 0-based from ``start``."""
    lines = read_lines(_Window(open(path, "rb", buffering=0), start, end), Path(path))  # noqa: SIM115
    invalid: list[tuple[int, str]] = []
    invalid_count = 0
    kinds: dict[str, list[Any]] = {}
    turns: dict[int, int] = {}
    extra: dict[str, int] = {}
    extra_other = 0
    hist = LengthHistogram()
    small = hist.small
    buffers = spill.buffers
    mask = spill.mask
    buffered = spill.buffered
    line = -1
    for line, raw in enumerate(lines):
        checked = check_line(raw)
        if isinstance(checked, str):
            invalid_count += 1
            if len(invalid) < INVALID_CAP:
                invalid.append((line, checked))
            kind = reason_kind(checked)
            entry = kinds.get(kind)
            if entry is None:
                kinds[kind] = [1, [line]]
            else:
                entry[0] += 1
                if len(entry[1]) < KIND_SAMPLES:
                    entry[1].append(line)
            continue
        digest = hash(checked.canonical)
        buffers[digest & mask].append(digest)
        buffered += 1
        if buffered >= BUFFERED_CAP:
            spill.flush()
            buffered = 0
        n = len(checked.messages)
        turns[n] = turns.get(n, 0) + 1
        chars = checked.content_chars
        if chars < EXACT_BELOW:
            small[chars] += 1
        else:
            hist.add_large(chars)
        obj = checked.obj
        if len(obj) > 1:
            for key in obj:
                if key in ("messages", "id", "meta"):
                    continue
                if key in extra:
                    extra[key] += 1
                elif len(extra) < EXTRA_KEYS_CAP:
                    extra[key] = 1
                else:
                    extra_other += 1
    spill.buffered = buffered
    return {
        "lines": line + 1,
        "invalid": invalid,
        "invalid_count": invalid_count,
        "kinds": kinds,
        "turns": turns,
        "extra": extra,
        "extra_other": extra_other,
        "hist": hist.to_state(),
    }


def _split(path: str, size: int, pieces: int) -> list[tuple[int, int]]:
    """``pieces`` byte ranges covering the file, each starting at a line start."""
    cuts = [0]
    with open(path, "rb") as f:
        for k in range(1, pieces):
            at = max(cuts[-1], k * size // pieces)
            f.seek(at)
            while True:
                block = f.read(1 << 16)
                if not block:
                    at = size
                    break
                nl = block.find(b"\n")
                if nl >= 0:
                    at += nl + 1
                    break
                at += len(block)
            if at >= size:
                break
            if at > cuts[-1]:
                cuts.append(at)
    cuts.append(size)
    return [(a, b) for a, b in itertools.pairwise(cuts) if b > a] or [(0, size)]


def _worker(conn: Any, path: str, start: int, end: int, parts: int, folder: str, tag: str) -> None:
    try:
        spill = DigestSpill(parts, folder, tag)
        result = _check_range(path, start, end, spill)
        spill.flush()
        conn.send(result)
    except BaseException as exc:  # the parent reports it; a worker never prints a traceback
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        conn.close()


def _hash_file(path: str, size: int) -> tuple[str, bytes]:
    digest = hashlib.sha256()
    last = b""
    with open(path, "rb", buffering=0) as f:
        left = size
        while left > 0:
            chunk = f.read(min(_CHUNK, left))
            if not chunk:
                break
            digest.update(chunk)
            last = chunk[-1:]
            left -= len(chunk)
    return digest.hexdigest(), last


# ---------------------------------------------------------------------------------------------
# A whole file


def survey(path: str, *, workers: int | None = None, spill_dir: str | None = None) -> dict[str, Any]:
    """Check every line of ``path``; returns the dataset's inspect record (1-based line numbers).

    ``spill_dir`` is where hashes spill (a temporary folder is made in it and removed after);
    None for the system's temporary folder.
    """
    began = time.monotonic()
    cpu_before = _cpu_seconds()
    size = os.stat(path).st_size
    workers = default_workers() if workers is None else max(1, workers)
    parts = partitions_for(size)
    ranges = _split(path, size, workers) if workers > 1 and size >= PARALLEL_MIN_BYTES else [(0, size)]
    spills: list[DigestSpill] = []
    shared: str | None = None
    try:
        if len(ranges) == 1:
            spills.append(DigestSpill(parts, None, "0", base=spill_dir))
            results = [_check_range(path, 0, size, spills[0])]
            sha256, last = _hash_file(path, size)
        else:
            shared = tempfile.mkdtemp(prefix="regen-inspect-", dir=spill_dir)
            results, sha256, last = _parallel(path, size, ranges, parts, shared)
            for k in range(len(ranges)):
                spill = DigestSpill(parts, shared, str(k))
                spill.written = True
                spills.append(spill)
        record = _merge(results)
        record["duplicates"] = record["valid"] - count_distinct(spills)
    finally:
        for spill in spills:
            spill.remove()
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)
    record.update(
        {
            "bytes": size,
            "sha256": sha256,
            "ends_with_newline": size == 0 or last == b"\n",
            "workers": len(ranges),
            "seconds": round(time.monotonic() - began, 3),
            "cpu_seconds": round(_cpu_seconds() - cpu_before, 3),
        }
    )
    return record


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the workers, once joined)."""
    now = os.times()
    return now.user + now.system + now.children_user + now.children_system


def _parallel(
    path: str, size: int, ranges: list[tuple[int, int]], parts: int, folder: str
) -> tuple[list[dict[str, Any]], str, bytes]:
    # fork: the workers inherit the modules shipped on stdin (nothing to import from disk) and the
    # interpreter's hash secret, so every worker hashes a prompt to the same value.
    ctx = multiprocessing.get_context("fork")
    # A forked worker would write out again whatever this process still has buffered.
    sys.stdout.flush()
    sys.stderr.flush()
    pipes = []
    procs = []
    for k, (start, end) in enumerate(ranges):
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_worker, args=(send, path, start, end, parts, folder, str(k)), daemon=True)
        proc.start()
        send.close()
        pipes.append(receive)
        procs.append(proc)
    try:
        sha256, last = _hash_file(path, size)
        results = []
        for k, receive in enumerate(pipes):
            try:
                result = receive.recv()
            except EOFError:
                raise RuntimeError(f"worker {k} ended without a result") from None
            if "error" in result:
                raise RuntimeError(f"worker {k}: {result['error']}")
            results.append(result)
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():  # pragma: no cover - only after an error above
                proc.kill()
                proc.join()
    return results, sha256, last


def _merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    lines = 0
    invalid: list[dict[str, Any]] = []
    invalid_count = 0
    kinds: dict[str, dict[str, Any]] = {}
    turns: dict[int, int] = {}
    extra: dict[str, int] = {}
    extra_other = 0
    hist = LengthHistogram()
    for result in results:
        offset = lines
        for line, reason in result["invalid"]:
            if len(invalid) < INVALID_CAP:
                invalid.append({"line": offset + line + 1, "reason": reason})
        invalid_count += result["invalid_count"]
        for kind, (count, sample) in result["kinds"].items():
            entry = kinds.setdefault(kind, {"count": 0, "first_lines": []})
            entry["count"] += count
            room = KIND_SAMPLES - len(entry["first_lines"])
            entry["first_lines"].extend(offset + s + 1 for s in sample[:room])
        for n, count in result["turns"].items():
            turns[n] = turns.get(n, 0) + count
        for key, count in result["extra"].items():
            if key in extra:
                extra[key] += count
            elif len(extra) < EXTRA_KEYS_CAP:
                extra[key] = count
            else:
                extra_other += count
        extra_other += result["extra_other"]
        hist.merge(LengthHistogram.from_state(result["hist"]))
        lines += result["lines"]
    return {
        "lines": lines,
        "valid": lines - invalid_count,
        "invalid": invalid,
        "invalid_count": invalid_count,
        "invalid_by_kind": kinds,
        "turns": {str(k): v for k, v in sorted(turns.items())},
        "content_chars": hist.percentiles(),
        "content_chars_exact": hist.exact,
        "extra_keys": dict(sorted(extra.items())),
        "extra_keys_other": extra_other,
    }


# ---------------------------------------------------------------------------------------------
# Results beside the prompts


def results_coverage(folder: str, prompts: int) -> dict[str, Any] | None:
    """How much of the dataset ``raw_responses.jsonl`` covers; None when there is none.

    One bit per prompt marks the lines that have a row, so memory is an eighth of a byte a prompt.
    """
    path = os.path.join(folder, RESULTS_FILE)
    try:
        f = open(path, "rb", buffering=0)  # noqa: SIM115 - read_lines closes it
    except FileNotFoundError:
        return None
    size = os.fstat(f.fileno()).st_size
    seen = bytearray((prompts + 7) // 8)
    rows = covered = duplicate = stray = bad = 0
    for raw in read_lines(_Window(f, 0, size), Path(path)):
        rows += 1
        try:
            line = _loads(raw).get("line")
        except (ValueError, AttributeError):
            bad += 1
            continue
        if type(line) is not int or not 0 <= line < prompts:
            stray += 1
            continue
        byte, bit = line >> 3, 1 << (line & 7)
        if seen[byte] & bit:
            duplicate += 1
        else:
            seen[byte] |= bit
            covered += 1
    last = b""
    if size:
        with open(path, "rb") as g:
            g.seek(size - 1)
            last = g.read(1)
    return {
        "path": path,
        "rows": rows,
        "covered": covered,
        "duplicate_rows": duplicate,
        "stray_rows": stray,
        "unreadable_rows": bad,
        "bytes": size,
        "ends_with_newline": size == 0 or last == b"\n",
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python3 survey.py FILE...``: one JSON line per file (for trying it by hand on a host)."""
    import json

    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: survey.py PROMPTS_FILE...", file=sys.stderr)
        return 2
    for path in args:
        print(json.dumps(survey(path), ensure_ascii=False), flush=True)
    return 0
