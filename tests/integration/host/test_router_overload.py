"""smg's overload veto with real smg in front of two stand-in SGLang servers over loopback, far more
than 8 in flight per worker, one worker with fewer running slots (a mixed fleet): smg's default
protection overrides round-robin by 10 s-old loads (the split skews to the worker it polled lighter);
regen's launch rule keeps round-robin, with every request answered and none stalled ~10 s."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from bench import router_overload as bench
from regen.engine.host.router import OVERLOAD_ARGS

pytest.importorskip("smg")


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[list[str]]:
    with bench.running_sims(tmp_path, 2) as urls:
        yield urls


def measure(urls: Sequence[str], flags: Sequence[str], tmp_path: Path) -> dict[str, object]:
    return asyncio.run(bench.run_one(urls, flags, 200, 2500, tmp_path / "smg.log"))


def test_default_protection_overrides_round_robin(workers: list[str], tmp_path: Path) -> None:
    r = measure(workers, [], tmp_path)
    split = r["split"]
    assert isinstance(split, list) and sum(split) == 2500
    assert split[0] > 0.6 * 2500, r  # round-robin would be 1250/1250: the veto decided


def test_regen_launch_rule_keeps_round_robin_and_never_stalls(workers: list[str], tmp_path: Path) -> None:
    r = measure(workers, OVERLOAD_ARGS, tmp_path)
    assert r["statuses"] == {200: 2500}, r
    assert r["split"] == [1250, 1250], r
    assert r["stalled"] == 0, r
