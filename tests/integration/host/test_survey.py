"""The host-side survey: the job's rules and scan's answers, in bounded memory, in one pass or many."""

from __future__ import annotations

import itertools
import math
import random
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from regen.engine.data.datasets import Dataset
from regen.engine.data.scan import scan
from regen.engine.host.scripts import survey as survey_module
from regen.engine.host.scripts.survey import EXACT_BELOW, LengthHistogram, _split, survey
from tests.support.processes import ENV


def write_mixed(path: Path, lines: int, seed: int = 7) -> None:
    """Valid prompts of many shapes, duplicates, every kind of bad line, long contents, no final newline."""
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        r = rng.random()
        if r < 0.02:
            out.append(
                rng.choice(
                    [
                        b"",
                        b"{oops",
                        b'{"messages": []}',
                        b"[1, 2]",
                        b'{"messages": [{"role": "assistant", "content": "a"}]}',
                    ]
                )
            )
        elif r < 0.05 and out:
            out.append(out[rng.randrange(len(out))])  # a duplicate (or a repeated bad line)
        else:
            turns = rng.choice((1, 1, 3))
            msgs = [{"role": "user", "content": "u" * rng.randrange(1, 300)}]
            for _ in range(turns // 2):
                msgs += [{"role": "assistant", "content": "a"}, {"role": "user", "content": f"more {i}"}]
            if rng.random() < 0.001:
                msgs[-1]["content"] = "L" * rng.randrange(EXACT_BELOW, 100_000)
            extra = {"tag": i % 3} if rng.random() < 0.1 else {}
            out.append(orjson.dumps({"messages": msgs, **extra}))
    path.write_bytes(b"\n".join(out))


def as_scan(path: Path) -> dict:
    report = scan(Dataset(path.parent.name, path.parent))
    return {
        "lines": report.lines,
        "valid": report.valid,
        "invalid": [{"line": i.line + 1, "reason": i.reason} for i in report.invalid],
        "duplicates": report.duplicates,
        "turns": {str(k): v for k, v in sorted(report.turns.items())},
        "extra_keys": report.extra_keys,
        "sha256": report.sha256,
        "bytes": report.size,
        "ends_with_newline": report.ends_with_newline,
        "chars": report.content_chars_percentiles(),
    }


def same_as_scan(record: dict, expected: dict) -> None:
    for key in (
        "lines",
        "valid",
        "duplicates",
        "turns",
        "extra_keys",
        "sha256",
        "bytes",
        "ends_with_newline",
    ):
        assert record[key] == expected[key], key
    assert record["invalid"] == expected["invalid"][: survey_module.INVALID_CAP], "the first ones, listed"
    assert record["invalid_count"] == len(expected["invalid"])
    for p, exact in expected["chars"].items():
        got = record["content_chars"][p]
        assert got <= exact and exact - got <= exact / 2048, (p, got, exact)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("survey") / "D"
    folder.mkdir()
    path = folder / "prompts.jsonl"
    write_mixed(path, 90_000)
    return path, as_scan(path)


def test_one_pass_and_parallel_ranges_agree_with_scan(
    big: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, expected = big
    monkeypatch.setattr(survey_module, "PARALLEL_MIN_BYTES", 1 << 20)
    one = survey(str(path), workers=1)
    assert one["workers"] == 1
    same_as_scan(one, expected)
    many = survey(str(path), workers=3)
    assert many["workers"] == 3
    same_as_scan(many, expected)
    assert many["invalid_by_kind"] == one["invalid_by_kind"] and many["content_chars"] == one["content_chars"]
    assert not one["content_chars_exact"], "some contents are past the exact range"


def test_spilled_hashes_count_the_same_duplicates_and_leave_nothing(
    big: tuple[Path, dict], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path, expected = big
    monkeypatch.setattr(survey_module, "BUFFERED_CAP", 5000)
    monkeypatch.setattr(survey_module, "PART_TARGET", 4096)
    monkeypatch.setattr(survey_module, "PARALLEL_MIN_BYTES", 1 << 20)
    flushed = []
    real_flush = survey_module.DigestSpill.flush

    def counting_flush(self: survey_module.DigestSpill) -> None:
        flushed.append(self.tag)
        real_flush(self)

    monkeypatch.setattr(survey_module.DigestSpill, "flush", counting_flush)
    spill = tmp_path / "spill"
    spill.mkdir()
    for workers in (1, 2):
        record = survey(str(path), workers=workers, spill_dir=str(spill))
        assert record["duplicates"] == expected["duplicates"]
        assert list(spill.iterdir()) == [], "the spill folder is removed"
    assert len(flushed) > 10, "hashes were written out, not held"


# VmHWM: this process's own peak (ru_maxrss would carry the forking parent's over the exec).
PEAK_RSS = """
import sys
from pathlib import Path
from regen.engine.data.datasets import Dataset
from regen.engine.data.scan import scan
from regen.engine.host.scripts import survey as s
s.BUFFERED_CAP, s.PART_TARGET, s.INVALID_CAP = 4096, 2048, 100
path = Path(sys.argv[2])
if sys.argv[1] == "survey":
    s.survey(str(path), workers=1, spill_dir=str(path.parent))
else:
    scan(Dataset(path.parent.name, path.parent))
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""


def peak_kib(what: str, path: Path) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, what, str(path)], capture_output=True, text=True, check=True, env=ENV
    )
    return int(done.stdout.split()[-1])


def test_memory_stays_flat_as_the_file_grows(tmp_path: Path) -> None:
    sizes = {}
    for lines in (30_000, 120_000):
        folder = tmp_path / str(lines)
        folder.mkdir()
        path = folder / "prompts.jsonl"
        # Every fifth line bad, every line a new prompt with its own extra key: the worst case for
        # what scan keeps (an invalid entry, a digest, a length and an extra-key name per line).
        path.write_bytes(
            b"".join(
                (
                    b"{bad\n"
                    if i % 5 == 0
                    else orjson.dumps({"messages": [{"role": "user", "content": f"p{i}"}], f"k{i}": 1})
                    + b"\n"
                )
                for i in range(lines)
            )
        )
        sizes[lines] = path
    grown = {
        what: peak_kib(what, sizes[120_000]) - peak_kib(what, sizes[30_000]) for what in ("scan", "survey")
    }
    # The job's scan keeps something per line: the check can see growth.
    # (here about 17 MB for 90,000 more lines, against 1-2 MB of allocator slack for the survey,
    # whose Python-level peak tracemalloc shows flat)
    assert grown["scan"] > 12 * 1024, grown
    assert grown["survey"] < 4 * 1024, grown


def test_caps_bound_what_a_record_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(survey_module, "INVALID_CAP", 100)
    path = tmp_path / "prompts.jsonl"
    lines = 5000
    path.write_bytes(
        b"".join(
            (
                b"{bad\n"
                if i % 5 == 0
                else orjson.dumps({"messages": [{"role": "user", "content": "p"}], f"k{i}": 1}) + b"\n"
            )
            for i in range(lines)
        )
    )
    record = survey(str(path), workers=1)
    assert record["invalid_count"] == lines // 5 and len(record["invalid"]) == 100
    assert record["invalid_by_kind"]["not valid JSON"] == {
        "count": lines // 5,
        "first_lines": [1, 6, 11, 16, 21],
    }
    assert len(record["extra_keys"]) == survey_module.EXTRA_KEYS_CAP
    assert record["extra_keys_other"] == lines - lines // 5 - survey_module.EXTRA_KEYS_CAP
    assert record["duplicates"] == lines - lines // 5 - 1


def test_the_histogram_is_exact_below_its_bound_and_close_above() -> None:
    rng = random.Random(3)
    values = [rng.randrange(0, EXACT_BELOW) for _ in range(5000)] + [
        int(rng.paretovariate(1.2) * 3000) for _ in range(5000)
    ]
    hist = LengthHistogram()
    for v in values:
        if v < EXACT_BELOW:
            hist.small[v] += 1
        else:
            hist.add_large(v)
    ordered = sorted(values)
    for p, got in hist.percentiles((1, 50, 90, 99, 100)).items():
        exact = ordered[min(len(ordered) - 1, max(0, math.ceil(int(p[1:]) / 100 * len(ordered)) - 1))]
        assert got <= exact and exact - got <= exact / 2048, (p, got, exact)
    assert len(hist.large) <= 2048 * 40
    assert LengthHistogram().percentiles() == {"p50": 0, "p90": 0, "p99": 0}


def test_ranges_cover_the_file_and_start_at_lines(tmp_path: Path) -> None:
    path = tmp_path / "f"
    rng = random.Random(1)
    path.write_bytes(
        b"".join(b"x" * rng.choice((0, 1, 5, 200, 70_000)) + b"\n" for _ in range(400)) + b"tail"
    )
    data = path.read_bytes()
    for pieces in (1, 2, 3, 7, 64):
        ranges = _split(str(path), len(data), pieces)
        assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        assert all(data[start - 1 : start] == b"\n" for start, _ in ranges[1:])
    one_line = tmp_path / "one"
    one_line.write_bytes(b"y" * 300_000)
    assert _split(str(one_line), 300_000, 4) == [(0, 300_000)]
