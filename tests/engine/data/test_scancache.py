"""The scan kept in the run folder (engine/data/scancache.py): an unchanged prompts file is not validated
again, a changed one always is, whatever kept its size and mtime."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from regen.engine.data import scancache
from regen.engine.data.datasets import Dataset
from regen.engine.data.scan import ScanReport, scan
from regen.engine.data.scancache import cached_scan

PROMPTS = [orjson.dumps({"messages": [{"role": "user", "content": f"question {n}"}]}) for n in range(40)]


def dataset(root: Path, lines: list[bytes]) -> Dataset:
    folder = root / "A"
    folder.mkdir(exist_ok=True)
    (folder / "prompts.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return Dataset("A", folder)


def same(a: ScanReport, b: ScanReport) -> bool:
    return (a.to_dict(), a.digests, a.content_chars, a.invalid) == (
        b.to_dict(),
        b.digests,
        b.content_chars,
        b.invalid,
    )


def kept_scan(ds: Dataset, run_dir: Path) -> tuple[ScanReport, bool]:
    """The scan as a start gets it, kept as the job keeps it once it holds the run folder; whether
    it came from the cache."""
    report, keep = cached_scan(ds, run_dir)
    if keep is not None:
        keep()
    return report, keep is None


def test_an_unchanged_file_is_read_from_the_cache_as_the_scan_found_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [
        *PROMPTS,
        b'{"messages": "not a list"}',
        PROMPTS[0],
        b'{"messages":[{"role":"user","content":"x"}],"k":1}',
    ]
    ds = dataset(tmp_path, lines)
    first, keep = cached_scan(ds, tmp_path / "run")
    assert keep is not None and not (tmp_path / "run").exists(), "kept only once the job holds the run folder"
    keep()
    assert (tmp_path / "run" / "scans" / "A.scan").is_file()
    assert same(first, scan(ds, keep_digests=True))

    def no_scan(*args: object, **kwargs: object) -> ScanReport:
        raise AssertionError("scanned again")

    monkeypatch.setattr(scancache, "scan", no_scan)
    again, cached = kept_scan(ds, tmp_path / "run")
    assert cached and same(again, first)
    assert again.invalid[0].line == 40 and again.duplicates == 1 and again.extra_keys == {"k": 1}


def test_an_edit_that_keeps_size_and_mtime_is_scanned_again(tmp_path: Path) -> None:
    ds = dataset(tmp_path, PROMPTS)
    before, _ = kept_scan(ds, tmp_path / "run")
    st = ds.prompts_path.stat()
    edited = list(PROMPTS)
    edited[5] = edited[5].replace(b"question 5", b"question X")  # same length
    ds.prompts_path.write_bytes(b"\n".join(edited) + b"\n")
    os.utime(ds.prompts_path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert ds.prompts_path.stat().st_size == st.st_size
    after, cached = kept_scan(ds, tmp_path / "run")
    assert (
        not cached and after.digest_of(5) != before.digest_of(5) and after.digest_of(4) == before.digest_of(4)
    )
    assert same(after, scan(ds, keep_digests=True))


def test_a_file_that_grew_is_scanned_again(tmp_path: Path) -> None:
    ds = dataset(tmp_path, PROMPTS)
    kept_scan(ds, tmp_path / "run")
    with ds.prompts_path.open("ab") as f:
        f.write(b'{"messages": 1}\n')
    report, cached = kept_scan(ds, tmp_path / "run")
    assert not cached and report.lines == 41 and len(report.invalid) == 1


@pytest.mark.parametrize("damage", ["torn", "garbage", "empty"])
def test_a_damaged_cache_is_ignored_and_rewritten(tmp_path: Path, damage: str) -> None:
    ds = dataset(tmp_path, PROMPTS)
    fresh, _ = kept_scan(ds, tmp_path / "run")
    cache = tmp_path / "run" / "scans" / "A.scan"
    data = cache.read_bytes()
    cache.write_bytes({"torn": data[:-7], "garbage": b"{not json\n" + data, "empty": b""}[damage])
    report, cached = kept_scan(ds, tmp_path / "run")
    assert not cached and same(report, fresh)
    assert cache.read_bytes() == data
    assert kept_scan(ds, tmp_path / "run")[1]
