"""regen's rule for smg's overload veto (docs/sglang.md, "The router's overload veto"): every launch
switches it off, once, in router_argv."""

from __future__ import annotations

from regen.engine.host.router import ADMISSION_ARGS, OVERLOAD_ARGS, router_argv


def test_every_launch_switches_the_veto_off() -> None:
    argv = router_argv(["http://127.0.0.1:1", "http://127.0.0.1:2"], 30000, 29000, 600)
    assert OVERLOAD_ARGS == ("--disable-worker-overload-protection",)
    assert argv.count("--disable-worker-overload-protection") == 1
    assert not any(a.startswith("--worker-overload") for a in argv)


def test_a_bench_can_ask_for_smg_default() -> None:
    argv = router_argv(["http://127.0.0.1:1"], 30000, 29000, 600, overload_args=())
    assert "--disable-worker-overload-protection" not in argv


def test_every_launch_lifts_smgs_own_admission_bound() -> None:
    # The job's in-flight limit is the bound; smg's own (4096 and a queue of 100) would refuse a
    # large cluster's in-flight with 429 (docs/sglang.md, "The router's admission bound").
    argv = router_argv(["http://127.0.0.1:1"], 30000, 29000, 600)
    assert ADMISSION_ARGS == ("--max-concurrent-requests", "0")
    at = argv.index("--max-concurrent-requests")
    assert argv[at + 1] == "0" and argv.count("--max-concurrent-requests") == 1
    assert "--max-concurrent-requests" not in router_argv(
        ["http://127.0.0.1:1"], 1, 2, 600, admission_args=()
    )
