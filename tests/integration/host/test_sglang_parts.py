"""The pieces of SGLang's lifecycle that need no host: the log's phases and failures, the flag check."""

from __future__ import annotations

from regen.engine.host.scripts.sglangctl import flag_problems
from regen.engine.host.scripts.sglanglog import PHASE_NAMES, scan, strip_prefix
from regen.sim.sglang.startup import CUDA_GRAPH_FAILED_ADVICE

HEALTHY = """[2026-02-26 16:41:05] server_args=ServerArgs(model_path='/m', tp_size=8)
[2026-02-26 16:41:05 TP0] Load weight begin. avail mem=139.28 GB
[2026-02-26 16:51:10 TP0] Load weight end. elapsed=605.50 s, type=KimiK25ForConditionalGeneration
[2026-02-26 16:51:12 TP0] KV Cache is allocated. #tokens: 1000000, K size: 17.00 GB, V size: 17.00 GB
[2026-02-26 16:51:12 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=31.70 GB
[2026-02-26 16:52:40 TP0] Capture cuda graph end. Time elapsed: 88.0 s. mem usage=1.91 GB. avail mem=29.79 GB.
[2026-02-26 16:52:40 TP0] max_total_num_tokens=1000000, chunked_prefill_size=8192, context_len=262144
INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)
[2026-02-26 16:52:45 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_token_ratio: 0.4 -> 0.6
[2026-02-26 16:52:43] The server is fired up and ready to roll!
"""


def test_a_healthy_start_walks_every_phase_in_order() -> None:
    seen = []
    from regen.engine.host.scripts.sglanglog import LogState

    state = LogState()
    for line in HEALTHY.splitlines():
        entered = state.feed(line)
        if entered:
            seen.append(entered)
    assert seen == list(PHASE_NAMES)  # the older capture lines count as well as 0.5.23's
    assert state.ready and state.failure is None and state.retractions == 1


def test_the_failure_named_is_the_error_under_the_schedulers_headline() -> None:
    log = (
        "[2026-02-26 16:41:05 TP0] Capture target decode CUDA graph begin. avail mem=31.70 GB\n"
        "[2026-02-26 16:41:06 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '[2026-02-26 16:41:06 TP0]   File "/x/cuda_graph_runner.py", line 391, in __init__\n'
        "[2026-02-26 16:41:06 TP0]     raise Exception(\n"
        "[2026-02-26 16:41:06 TP0] Exception: Capture cuda graph failed: CUDA out of memory.\n"
        + "".join(f"[2026-02-26 16:41:06 TP0] {line}\n" for line in CUDA_GRAPH_FAILED_ADVICE.splitlines())
        + "[2026-02-26 16:41:06] Received sigquit from a child process. It usually means the child failed.\n"
    )
    state = scan(log)
    assert state.phase == "cuda graphs"
    assert state.failure == "Exception: Capture cuda graph failed: CUDA out of memory."
    assert state.failure_where == "cuda graphs"
    assert scan("launch_server.py: error: unrecognized arguments: --nope 1\n").failure_where == "command line"
    # A watchdog line in a running server's log, timestamp and all.
    assert (
        scan(
            "[2026-02-26 17:00:00 TP0] Scheduler watchdog timeout (self.watchdog_timeout=300)\n"
        ).failure_where
        == "running"
    )
    assert strip_prefix("[2026-02-26 16:41:06 TP3] Load weight begin.") == "Load weight begin."
    assert strip_prefix("INFO:     Uvicorn running") == "INFO:     Uvicorn running"


def test_flags_are_checked_as_argparse_would_take_them() -> None:
    listed = {
        "--tp-size",
        "--tensor-parallel-size",
        "--port",
        "--cuda-graph-max-bs-decode",
        "--cuda-graph-max-bs-prefill",
        "--enable-metrics",
        "--mem-fraction-static",
    }
    assert flag_problems(["--port", "--tp", "--mem-frac", "--enable-metrics"], listed) == []
    problems = flag_problems(["--cuda-graph-max-bs", "--no-such-flag"], listed)
    assert problems == [
        "--cuda-graph-max-bs is ambiguous in this sglang (could be --cuda-graph-max-bs-decode, "
        "--cuda-graph-max-bs-prefill)",
        "--no-such-flag is not a flag of this sglang's launch_server (not in --help)",
    ]
