"""The startup sequence: SGLang's log phases in order, each phase's failure signature on demand.

Phases and lines follow docs/sglang.md ("Startup"): weights, the KV pool, CUDA graph capture, the
scheduler's summary line, uvicorn coming up, the warmup request, then the ready line. /health
answers 503 until the ready line. A failure injected at a phase prints that phase's signature and
the server dies the way SGLang's does: the child's exception, the parent's "Received sigquit from a
child process", then the whole process tree is killed.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable

from regen.sim.sglang.config import SimSGLangConfig
from regen.sim.sglang.request import Sampling
from regen.sim.sglang.scheduler import soft_watchdog_line
from regen.sim.sglang.state import EXIT_KILLED, SIGQUIT_LINE, SGLangState

__all__ = ["CUDA_GRAPH_FAILED_ADVICE", "run_startup"]

_GPU_MEM_GB = 139.28
_WEIGHT_GB = 73.58
_GRAPH_GB = 1.91
_KV_BYTES_PER_TOKEN = 34_000

# 0.5.23's advice after a failed decode capture (model_executor/runner_backend_utils/__init__.py).
CUDA_GRAPH_FAILED_ADVICE = (
    "Possible solutions:\n"
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
    "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
    "(Not recommended. Huge performance loss)\n"
    "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n"
)


def _traceback(frames: list[tuple[str, int, str, str]], error: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        lines.append(
            f'  File "/usr/local/lib/python3.12/dist-packages/sglang/{path}", line {line}, in {func}'
        )
        lines.append(f"    {code}")
    lines.append(error)
    return "\n".join(lines)


def _scheduler_failure(error: str, frames: list[tuple[str, int, str, str]]) -> str:
    base = [
        (
            "srt/managers/scheduler.py",
            3124,
            "run_scheduler_process",
            "scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)",
        ),
        ("srt/managers/scheduler.py", 412, "__init__", "self.init_model_worker()"),
        ("srt/managers/tp_worker.py", 236, "__init__", "self._model_runner = ModelRunner("),
    ]
    return "Scheduler hit an exception: " + _traceback(base + frames, error)


async def _sleep(sim: SGLangState, seconds: float) -> float:
    """A phase's time. The scheduler's soft watchdog counts initialisation as activity, so a phase
    longer than --soft-watchdog-timeout logs its (harmless) line once per period."""
    cfg = sim.config
    duration = seconds * cfg.time_scale
    soft = cfg.soft_watchdog_timeout
    left = duration
    while soft is not None and left > soft * cfg.time_scale:
        await asyncio.sleep(soft * cfg.time_scale)
        left -= soft * cfg.time_scale
        sim.log.scheduler(soft_watchdog_line(soft), level="error")
    await asyncio.sleep(left)
    return duration


async def _fail(sim: SGLangState, scheduler_lines: list[str]) -> None:
    for line in scheduler_lines:
        sim.log.scheduler(line, level="error")
    sim.phase = "failed"
    await sim.crash(EXIT_KILLED, [SIGQUIT_LINE])


async def run_startup(sim: SGLangState, listen: Callable[[], Awaitable[None]]) -> None:
    """SGLang's startup phases in order, with the config as it was when they began; a phase that
    fails has ended the server (`sim.crashed`), and the sequence with it. `listen` starts the HTTP
    server accepting connections."""
    cfg = sim.config
    started = time.monotonic()
    _announce(sim, cfg)
    avail = await _load_weights(sim, cfg)
    if avail is None:
        return
    avail = await _allocate_kv_pool(sim, cfg, avail)
    if avail is None:
        return
    if not await _capture_cuda_graphs(sim, cfg, avail):
        return
    if not await _start_http(sim, cfg, listen):
        return
    if not await _warm_up(sim, cfg):
        return
    sim.stats.startup_phases["e2e"] = time.monotonic() - started
    sim.stats.ready_at = time.monotonic()
    sim.phase = "ready"
    sim.ready.set()
    sim.log.main("The server is fired up and ready to roll!")


def _announce(sim: SGLangState, cfg: SimSGLangConfig) -> None:
    log = sim.log
    log.main(
        f"server_args=ServerArgs(model_path='{cfg.model_path}', tokenizer_path='{cfg.tokenizer_path or cfg.model_path}', "
        f"served_model_name='{cfg.served_name}', tp_size={cfg.tp_size}, dp_size={cfg.dp_size}, "
        f"host='{sim.host}', port={sim.port}, mem_fraction_static={cfg.mem_fraction_static}, "
        f"max_running_requests={cfg.max_running_requests}, max_total_tokens={cfg.max_total_tokens}, "
        f"context_length={cfg.context_length}, enable_metrics={cfg.enable_metrics}, "
        f"watchdog_timeout={cfg.watchdog_timeout}, api_key={'***' if cfg.api_key else None})"
    )
    log.scheduler("Init torch distributed begin.")
    log.scheduler("Init torch distributed ends. elapsed=0.27 s, mem usage=0.09 GB")


async def _load_weights(sim: SGLangState, cfg: SimSGLangConfig) -> float | None:
    """The weights phase; returns the GPU memory left after it (GB), None if it failed."""
    log = sim.log
    sim.phase = "weights"
    log.scheduler(f"Load weight begin. avail mem={_GPU_MEM_GB:.2f} GB")
    took = await _sleep(sim, cfg.startup_weights_s)
    if cfg.faults.startup_fail_at == "weights":
        await _fail(
            sim,
            [
                _scheduler_failure(
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a total "
                    "capacity of 139.81 GiB of which 1.02 GiB is free.",
                    [("srt/model_executor/model_runner.py", 780, "load_model", "self.model = get_model(")],
                )
            ],
        )
        return None
    avail = _GPU_MEM_GB - _WEIGHT_GB
    arch = cfg.architectures[0] if cfg.architectures else "ForCausalLM"
    log.scheduler(
        f"Load weight end. elapsed={took:.2f} s, type={arch}, dtype=torch.bfloat16, "
        f"avail mem={avail:.2f} GB, mem usage={_WEIGHT_GB:.2f} GB."
    )
    sim.stats.startup_phases["load_weight"] = took
    return avail


async def _allocate_kv_pool(sim: SGLangState, cfg: SimSGLangConfig, avail: float) -> float | None:
    """The KV pool phase; returns the GPU memory left after it (GB), None if it failed."""
    log = sim.log
    sim.phase = "kv_pool"
    kv_gb = cfg.max_total_tokens * _KV_BYTES_PER_TOKEN / 1e9
    log.scheduler("Using KV cache dtype: torch.bfloat16")
    took = await _sleep(sim, cfg.startup_kv_pool_s)
    if cfg.faults.startup_fail_at == "kv_pool":
        await _fail(
            sim,
            [
                _scheduler_failure(
                    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
                    [
                        (
                            "srt/model_executor/model_runner.py",
                            1402,
                            "init_memory_pool",
                            'raise RuntimeError("Not enough memory. Please try to increase --mem-fraction-static.")',
                        )
                    ],
                )
            ],
        )
        return None
    log.scheduler(
        f"KV Cache is allocated. #tokens: {cfg.max_total_tokens}, K size: {kv_gb / 2:.2f} GB, "
        f"V size: {kv_gb / 2:.2f} GB"
    )
    avail -= kv_gb
    log.scheduler(f"Memory pool end. avail mem={avail:.2f} GB")
    sim.stats.startup_phases["kv_cache_allocation"] = took
    return avail


def _capture_roles(cfg: SimSGLangConfig) -> tuple[str, ...]:
    """The graphs 0.5.23 captures: the target's decode graph, or with speculative decoding its
    verify graph and then the draft's decode and extend graphs (cuda_graph_setup.py)."""
    if cfg.speculative_algorithm:
        return ("target verify", "draft decode", "draft extend")
    return ("target decode",)


async def _capture_cuda_graphs(sim: SGLangState, cfg: SimSGLangConfig, avail: float) -> bool:
    """The CUDA graph phase, then the scheduler's summary line; False if it failed."""
    log = sim.log
    sim.phase = "cuda_graph"
    roles = _capture_roles(cfg)
    if cfg.legacy_capture_log:
        log.scheduler(
            f"Capture cuda graph begin. This can take up to several minutes. avail mem={avail:.2f} GB"
        )
    else:
        role = roles[0]
        log.scheduler(
            f"Capture {role} CUDA graph begin. backend=full, num_tokens_per_req={1 if role.endswith('decode') else 4}, "
            f"avail mem={avail:.2f} GB"
        )
    took = await _sleep(sim, cfg.startup_cuda_graph_s)
    if cfg.faults.startup_fail_at == "cuda_graph":
        await _fail(
            sim,
            [
                _scheduler_failure(
                    "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
                    "has a total capacity of 139.81 GiB of which 1.06 GiB is free.\n"
                    + CUDA_GRAPH_FAILED_ADVICE,
                    [
                        (
                            "srt/model_executor/runner/decode_cuda_graph_runner.py",
                            603,
                            "__init__",
                            "raise Exception(",
                        )
                    ],
                )
            ],
        )
        return False
    avail -= _GRAPH_GB
    if cfg.legacy_capture_log:
        log.scheduler(
            f"Capture cuda graph end. Time elapsed: {took:.2f} s. mem usage={_GRAPH_GB:.2f} GB. "
            f"avail mem={avail:.2f} GB."
        )
    else:
        log.scheduler(
            f"Capture {roles[0]} CUDA graph end. bs=[1, 2, 4, 8], elapsed={took:.2f} s, "
            f"mem usage={_GRAPH_GB:.2f} GB, avail mem={avail:.2f} GB."
        )
        # A speculative server captures its draft model's graphs next (speculative/eagle_worker_v2.py).
        for role in roles[1:]:
            log.scheduler(f"Capture {role} CUDA graph begin. backend=full, avail mem={avail:.2f} GB")
            log.scheduler(
                f"Capture {role} CUDA graph end. elapsed=0.00 s, mem usage=0.00 GB, avail mem={avail:.2f} GB."
            )
    sim.stats.startup_phases["cuda_graph"] = took
    log.scheduler(
        f"max_total_num_tokens={cfg.max_total_tokens}, chunked_prefill_size={cfg.chunked_prefill_size}, "
        f"max_prefill_tokens={cfg.max_prefill_tokens}, max_running_requests={cfg.running_cap}, "
        f"context_len={sim.context_len}, available_gpu_mem={avail:.2f} GB"
    )
    return True


async def _start_http(sim: SGLangState, cfg: SimSGLangConfig, listen: Callable[[], Awaitable[None]]) -> bool:
    """Uvicorn comes up and listens; False if the port could not be had (the server exits 1)."""
    log = sim.log
    sim.phase = "http"
    await _sleep(sim, cfg.startup_http_s)
    log.uvicorn(f"Started server process [{os.getpid()}]")
    log.uvicorn("Waiting for application startup.")
    log.uvicorn("Application startup complete.")
    if cfg.faults.startup_fail_at == "http" or sim.bind_error is not None:
        err = sim.bind_error
        errno = err.errno if err is not None and err.errno else 98
        reason = (err.strerror if err is not None else None) or "address already in use"
        log.raw(
            f"ERROR:    [Errno {errno}] error while attempting to bind on address "
            f"('{sim.host}', {sim.port}): {reason.lower()}"
        )
        log.uvicorn("Waiting for application shutdown.")
        log.uvicorn("Application shutdown complete.")
        sim.phase = "failed"
        await sim.crash(1)
        return False
    await listen()
    log.uvicorn(f"Uvicorn running on http://{sim.host}:{sim.port} (Press CTRL+C to quit)")
    return True


async def _warm_up(sim: SGLangState, cfg: SimSGLangConfig) -> bool:
    """The warmup request through the scheduler, unless skipped; False if it failed."""
    log = sim.log
    sim.phase = "warmup"
    if cfg.skip_server_warmup:
        return True
    await _sleep(sim, cfg.startup_warmup_s)
    if cfg.faults.startup_fail_at == "warmup":
        sim.phase = "failed"
        log.main(
            "Initialization failed. warmup error: "
            + _traceback(
                [
                    (
                        "srt/entrypoints/http_server.py",
                        1473,
                        "_execute_server_warmup",
                        'assert res.status_code == 200, f"{res}"',
                    )
                ],
                "AssertionError: <Response [500]>",
            ),
            level="error",
        )
        await sim.crash(EXIT_KILLED)
        return False
    if cfg.access_log:
        log.uvicorn('127.0.0.1:0 - "GET /get_model_info HTTP/1.1" 200 OK')
    warm = sim.new_req(
        f"warmup-{os.getpid()}",
        sim.tokenizer.encode("The capital city of France is"),
        Sampling(max_new_tokens=8, temperature=0.0),
        internal=True,
    )
    sim.scheduler.submit(warm)
    while warm.finish is None:
        warm.event.clear()
        await warm.event.wait()
    if cfg.access_log:
        log.uvicorn('127.0.0.1:0 - "POST /generate HTTP/1.1" 200 OK')
    return True
