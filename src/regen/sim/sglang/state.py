"""What every part of the SGLang simulator shares: the live config, the tokenizer, the log, the
scheduler and its statistics, the startup phase, the clients waiting on /generate and the counters
a test asserts on; and what only the state is needed for: a new request, the bookkeeping when one
ends, a config swap, the server's death.

`SGLangSim` (server.py) is this state plus an HTTP server; the startup sequence (startup.py) and
the route modules (generate.py, health.py, info.py, metrics.py, control.py, admin.py) take it as
their first argument, so none of them imports the server back.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from aiohttp import web

from regen.sim.sglang.config import SimSGLangConfig
from regen.sim.sglang.logs import SimLog
from regen.sim.sglang.request import Req, Sampling, plan_output
from regen.sim.sglang.scheduler import Scheduler
from regen.sim.sglang.stats import Stats
from regen.sim.sglang.tokens import SimTokenizer

__all__ = ["EXIT_KILLED", "SIGQUIT_LINE", "SIGTERM_LINE", "SGLangState"]

# The exit status of a process SGLang ends with kill_process_tree: SIGKILL.
EXIT_KILLED = -9
# What the parent logs when a child process dies (a failed startup phase, the watchdog).
SIGQUIT_LINE = "Received sigquit from a child process. It usually means the child failed."
# What the tokenizer manager logs on SIGTERM (0.5.23 SignalHandler.sigterm_handler, called by Python's
# signal machinery with the signal's number and the interrupted frame).
SIGTERM_LINE = "SIGTERM received. signum=15 frame=None. Draining requests and shutting down..."


class SGLangState:
    """`config` may be replaced at any time (apply_config); it is read live. `on_watchdog` is what
    the server does when the scheduler's watchdog fires."""

    def __init__(
        self, config: SimSGLangConfig, tokenizer: SimTokenizer, log: SimLog, on_watchdog: Callable[[], None]
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.log = log
        log.level, log.http_level = config.log_level, config.log_level_http
        self.stats = Stats()
        self.scheduler = Scheduler(lambda: self.config, self.stats, self.log, self._on_finish, on_watchdog)
        self.phase = "init"
        self.requests: deque[dict[str, Any]] = deque(maxlen=self.config.requests_maxlen)
        self.aborted_rids: deque[str] = deque(maxlen=self.config.requests_maxlen)
        self.abort_requests: deque[str | None] = deque(maxlen=self.config.requests_maxlen)  # with record_ids
        self.http_requests = 0
        self.generate_bytes = 0  # bytes of /generate answers written (bodies and stream events)
        self.connections = 0  # client connections that sent a request
        self._transports: weakref.WeakSet[Any] = weakref.WeakSet()
        self.in_flight = 0
        self.peak_in_flight = 0
        self.peak_running = 0
        self.peak_queue = 0
        self.faults_injected: dict[str, int] = {}
        self.shutting_down = False
        self.ready = asyncio.Event()
        self.crashed: asyncio.Future[int] | None = None
        self.rng = random.Random(self.config.seed)
        # Each request waiting on /generate, with its client's transport (to drop it, to see it go).
        self.clients: dict[Req, Any] = {}
        self.site: web.BaseSite | None = None  # set while the HTTP phase listens
        self.bind_error: OSError | None = None
        self._host = "127.0.0.1"
        self._port: int | None = None

    # --- what the server is --------------------------------------------------------------------------
    @property
    def context_len(self) -> int:
        return self.config.context_len

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("simulator not started")
        return self._port

    @property
    def host(self) -> str:
        return self._host

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def listening(self) -> bool:
        return self.site is not None

    # --- requests ------------------------------------------------------------------------------------
    def new_req(
        self,
        rid: str,
        prompt_ids: list[int],
        sampling: Sampling,
        *,
        stream: bool = False,
        log_metrics: bool = True,
        internal: bool = False,
    ) -> Req:
        cfg = self.config
        plan = plan_output(
            prompt_ids,
            sampling,
            self.tokenizer,
            seed=cfg.seed,
            dist=cfg.output_len_dist,
            lo=cfg.output_len_min,
            hi=cfg.output_len_max,
            median=cfg.output_len_median,
            sigma=cfg.output_len_sigma,
            reasoning_share=cfg.reasoning_share,
            drift=cfg.drift,
            drift_after=cfg.drift_after_tokens,
        )
        return Req(
            rid=rid,
            prompt_ids=prompt_ids,
            sampling=sampling,
            plan=plan,
            tok=self.tokenizer,
            stream=stream,
            log_metrics=log_metrics,
            internal=internal,
        )

    def _on_finish(self, req: Req) -> None:
        """The front end's bookkeeping when a request ends (SGLang counts at the end)."""
        self.peak_running = max(self.peak_running, len(self.scheduler.running) + 1)
        f = req.finish or {}
        kind = str(f.get("type"))
        if req.internal:
            return
        s = self.stats
        s.finish_counts[kind] = s.finish_counts.get(kind, 0) + 1
        if kind == "abort":
            s.aborted += 1
            self.aborted_rids.append(req.rid)
        if req.log_metrics:
            self._count_finished(req)
        summary = {
            "rid": req.rid,
            "stream": req.stream,
            "prompt_tokens": req.n_prompt,
            "completion_tokens": len(req.output_ids),
            "cached_tokens": req.cached_tokens,
            "num_retractions": req.num_retractions,
            "finish_reason": req.finish,
            "thinking": req.plan.thinking,
            "fault": req.fault,
        }
        if self.config.record_ids:
            summary["prompt_ids"] = list(req.prompt_ids)
            summary["output_ids"] = list(req.output_ids)
        self.requests.append(summary)

    def _count_finished(self, req: Req) -> None:
        """A finished request's tokens and latencies in the statistics /metrics reports."""
        s = self.stats
        s.requests += 1
        if not req.in_queue_abort:
            s.prompt_tokens += req.n_prompt
            s.cached_tokens += req.cached_tokens
        out = len(req.output_ids)
        s.generation_tokens += out
        end = req.finished_at or time.monotonic()
        e2e = end - req.arrived
        s.e2e.observe(e2e)
        if req.first_token_at is not None:
            ttft = req.first_token_at - req.arrived
            s.ttft.observe(ttft)
            if out > 1:
                per = (e2e - ttft) / (out - 1)
                s.tpot.observe(per)
                s.itl.observe(per, out - 1)

    def saw(self, transport: Any) -> None:
        """A request arrived on `transport`: counted once per connection (keep-alive reuse shows)."""
        if transport is not None and transport not in self._transports:
            self._transports.add(transport)
            self.connections += 1

    # --- the server's state changing -----------------------------------------------------------------
    def apply_config(self, config: SimSGLangConfig) -> None:
        if config.seed != self.config.seed:
            self.rng.seed(config.seed)
        if config.requests_maxlen != self.requests.maxlen:
            self.requests = deque(self.requests, maxlen=config.requests_maxlen)
            self.aborted_rids = deque(self.aborted_rids, maxlen=config.requests_maxlen)
        conservativeness_changed = config.schedule_conservativeness != self.config.schedule_conservativeness
        self.config = config
        self.log.level, self.log.http_level = config.log_level, config.log_level_http
        if conservativeness_changed:
            self.scheduler.reset_ratio()
        self.scheduler.wake()

    def begin_shutdown(self) -> None:
        """SIGTERM: health answers 503 from now on; requests in flight may still finish."""
        self.shutting_down = True
        self.log.main(SIGTERM_LINE, level="warning")

    async def crash(self, status: int, lines: list[str] | None = None) -> None:
        """The server dies: log `lines`, stop answering, resolve `crashed` with `status`."""
        if self.crashed is None or self.crashed.done():
            return
        for line in lines or []:
            self.log.main(line, level="error")
        self.phase = "crashed"
        if self.site is not None:
            site, self.site = self.site, None
            with contextlib.suppress(Exception):
                await site.stop()
        for req, transport in list(self.clients.items()):
            req.dropped = True
            req.event.set()
            if transport is not None:
                transport.close()
        await self.scheduler.close()
        self.crashed.set_result(status)

    def state(self) -> dict[str, Any]:
        sched = self.scheduler
        s = self.stats
        return {
            "phase": self.phase,
            "ready": self.ready.is_set(),
            "listening": self.listening,
            "shutting_down": self.shutting_down,
            "paused": sched.paused,
            "hung": sched.hung,
            "running": len(sched.running),
            "queued": len(sched.waiting),
            "kv_used_tokens": sched.kv_used,
            "max_total_tokens": self.config.max_total_tokens,
            "new_token_ratio": sched.new_token_ratio,
            "forward_ct": sched.forward_ct,
            "http_requests": self.http_requests,
            "connections": self.connections,
            "generate_bytes": self.generate_bytes,
            "in_flight": self.in_flight,
            "peak_in_flight": self.peak_in_flight,
            "peak_running": self.peak_running,
            "peak_queue": self.peak_queue,
            "counters": {
                "requests": s.requests,
                "prompt_tokens": s.prompt_tokens,
                "generation_tokens": s.generation_tokens,
                "cached_tokens": s.cached_tokens,
                "aborted": s.aborted,
                "retracted": s.retracted_total,
                "finish": dict(s.finish_counts),
            },
            "gen_throughput": s.gen_throughput,
            "startup_phases": dict(s.startup_phases),
            "faults_injected": dict(self.faults_injected),
            "aborted_rids": list(self.aborted_rids),
            "live_rids": list(sched.live),
            "tokenizer": self.tokenizer.info(),
            "requests": list(self.requests),
            "abort_requests": list(self.abort_requests),
        }
