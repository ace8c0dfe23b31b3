"""`SGLangSim`: a real aiohttp server speaking SGLang's native HTTP API on loopback.

One process, one event loop: the HTTP handlers, the scheduler task, the watchdog and the startup
sequence. The listening socket is bound at `start()` (so port 0 gets its number at once) but only
listens from the HTTP phase on, so a client connecting earlier is refused, as with the real server
before uvicorn is up. `crashed` resolves with the exit status the process must end with when the
server dies (a startup failure, the watchdog): the standalone runner ends the process with it; a
test holding the server in its own process just awaits it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

from regen.sim.sglang import info, metrics
from regen.sim.sglang.config import SimSGLangConfig, patched, problems
from regen.sim.sglang.logs import SimLog
from regen.sim.sglang.request import Req, Sampling, plan_output
from regen.sim.sglang.scheduler import Scheduler
from regen.sim.sglang.startup import run_startup
from regen.sim.sglang.stats import Stats
from regen.sim.sglang.tokens import SimTokenizer
from regen.sim.sglang.wire import (
    GenerateError,
    error_400,
    http_error,
    json_response,
    parse_generate,
    validation_error,
)

__all__ = ["SGLangSim"]

_DEFAULT_CONTEXT = 131072
_OPEN_PATHS = ("/health", "/ready", "/metrics", "/_sim/")
# The exit status of a process SGLang ends with kill_process_tree: SIGKILL.
EXIT_KILLED = -9


class SGLangSim:
    """The simulated server. `config` may be replaced at any time (apply_config); it is read live."""

    def __init__(
        self,
        config: SimSGLangConfig | None = None,
        tokenizer: SimTokenizer | None = None,
        *,
        log: SimLog | None = None,
    ) -> None:
        self.config = config if config is not None else SimSGLangConfig()
        if tokenizer is None:
            raise ValueError("SGLangSim needs a tokenizer (SimTokenizer)")
        self.tokenizer = tokenizer
        self.log = log if log is not None else SimLog()
        self.stats = Stats()
        self.scheduler = Scheduler(
            lambda: self.config, self.stats, self.log, self._on_finish, self._on_watchdog
        )
        self.phase = "init"
        self.requests: deque[dict[str, Any]] = deque(maxlen=self.config.requests_maxlen)
        self.aborted_rids: deque[str] = deque(maxlen=self.config.requests_maxlen)
        self.abort_requests: deque[str | None] = deque(maxlen=self.config.requests_maxlen)  # with record_ids
        self.http_requests = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.peak_running = 0
        self.peak_queue = 0
        self.faults_injected: dict[str, int] = {}
        self.shutting_down = False
        self.on_listening: Callable[[str], None] | None = None
        self.defer_bind_errors = False
        self.ready = asyncio.Event()
        self.crashed: asyncio.Future[int] | None = None
        self._rng = random.Random(self.config.seed)
        self._clients: dict[Req, Any] = {}
        self._runner: web.AppRunner | None = None
        self._site: web.BaseSite | None = None
        self._sock: socket.socket | None = None
        self.bind_error: OSError | None = None
        self._host = "127.0.0.1"
        self._port: int | None = None
        self._tasks: list[asyncio.Task[Any]] = []

    # --- what the server is --------------------------------------------------------------------------
    @property
    def context_len(self) -> int:
        return self.config.context_length or _DEFAULT_CONTEXT

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
        return self._site is not None

    # --- lifecycle -----------------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Bind the port and begin the startup phases; returns at once (await `wait_ready`)."""
        self._host = host
        self.crashed = asyncio.get_running_loop().create_future()
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            if not self.defer_bind_errors:
                raise
            # SGLang finds a taken port only when uvicorn starts: the HTTP phase fails then.
            self.bind_error = exc
            self._port = port
        else:
            self._sock = sock
            self._port = int(sock.getsockname()[1])
        self._runner = web.AppRunner(
            self.make_app(), access_log=None, handler_cancellation=False, shutdown_timeout=1.0
        )
        await self._runner.setup()
        self.scheduler.start()
        self._tasks.append(asyncio.create_task(run_startup(self), name="sglang-sim-startup"))
        self._tasks.append(asyncio.create_task(self._sweep_clients(), name="sglang-sim-sweeper"))

    async def listen(self) -> None:
        """The HTTP phase: start accepting connections on the bound socket."""
        assert self._runner is not None and self._sock is not None
        site = web.SockSite(self._runner, self._sock, backlog=4096)
        await site.start()
        self._site = site
        if self.on_listening is not None:
            self.on_listening(self.base_url)

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Until the ready line; raises RuntimeError if the server died first."""
        assert self.crashed is not None
        ready: asyncio.Future[Any] = asyncio.ensure_future(self.ready.wait())
        waiting: list[asyncio.Future[Any]] = [ready, self.crashed]
        try:
            done, _ = await asyncio.wait(waiting, timeout=timeout, return_when="FIRST_COMPLETED")
        finally:
            ready.cancel()
        if self.crashed.done():
            raise RuntimeError(f"the simulated server died (exit status {self.crashed.result()})")
        if not done:
            raise TimeoutError(f"the simulated server was not ready within {timeout} s (phase {self.phase})")

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        await self.scheduler.close()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        self._site = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    async def __aenter__(self) -> SGLangSim:
        if self._runner is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def crash(self, status: int, lines: list[str] | None = None) -> None:
        """The server dies: log `lines`, stop answering, resolve `crashed` with `status`."""
        if self.crashed is None or self.crashed.done():
            return
        for line in lines or []:
            self.log.main(line)
        self.phase = "crashed"
        if self._site is not None:
            site, self._site = self._site, None
            with contextlib.suppress(Exception):
                await site.stop()
        for req, transport in list(self._clients.items()):
            req.dropped = True
            req.event.set()
            if transport is not None:
                transport.close()
        await self.scheduler.close()
        self.crashed.set_result(status)

    def begin_shutdown(self) -> None:
        """SIGTERM: health answers 503 from now on; requests in flight may still finish."""
        self.shutting_down = True
        self.log.main("Received sigterm. Gracefully exiting...")

    def apply_config(self, config: SimSGLangConfig) -> None:
        if config.seed != self.config.seed:
            self._rng.seed(config.seed)
        if config.requests_maxlen != self.requests.maxlen:
            self.requests = deque(self.requests, maxlen=config.requests_maxlen)
            self.aborted_rids = deque(self.aborted_rids, maxlen=config.requests_maxlen)
        conservativeness_changed = config.schedule_conservativeness != self.config.schedule_conservativeness
        self.config = config
        if conservativeness_changed:
            self.scheduler.reset_ratio()
        self.scheduler.wake()

    # --- the app -------------------------------------------------------------------------------------
    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=[self._auth_middleware])
        r = app.router
        r.add_post("/generate", self._generate)
        r.add_put("/generate", self._generate)
        r.add_get("/health", self._health)
        r.add_get("/health_generate", self._health)
        r.add_get("/ready", self._ready)
        r.add_get("/get_model_info", self._get_model_info)
        r.add_get("/get_server_info", self._get_server_info)
        r.add_get("/model_info", self._model_info)
        r.add_get("/server_info", self._server_info)
        r.add_get("/v1/models", self._models)
        r.add_get("/v1/models/{model:.+}", self._model_card)
        r.add_get("/metrics", self._metrics)
        r.add_post("/abort_request", self._abort_request)
        r.add_get("/flush_cache", self._flush_cache)
        r.add_post("/flush_cache", self._flush_cache)
        r.add_post("/pause_generation", self._pause)
        r.add_post("/continue_generation", self._continue)
        r.add_get("/slow_down", self._slow_down)
        r.add_post("/slow_down", self._slow_down)
        r.add_get("/_sim/state", self._state_route)
        r.add_get("/_sim/config", self._config_get)
        r.add_post("/_sim/config", self._config_post)
        r.add_route("*", "/{tail:.*}", self._not_found)
        return app

    @web.middleware
    async def _auth_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        key = self.config.api_key
        if key and not request.path.startswith(_OPEN_PATHS):
            scheme, _, given = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or given.strip() != key:
                return json_response({"error": "Unauthorized"}, 401)
        if self.config.access_log:
            response = await handler(request)
            peer = request.transport.get_extra_info("peername") if request.transport else None
            where = f"{peer[0]}:{peer[1]}" if peer else "-"
            self.log.uvicorn(f'{where} - "{request.method} {request.path} HTTP/1.1" {response.status}')
            return response
        return await handler(request)

    async def _not_found(self, request: web.Request) -> web.StreamResponse:
        return json_response({"detail": "Not Found"}, 404)

    # --- /generate -----------------------------------------------------------------------------------
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

    def _draw_fault(self, req: Req) -> str | None:
        f = self.config.faults
        for name, rate in (("http_503", f.http_503_rate), ("abort", f.abort_rate), ("drop", f.drop_rate)):
            if rate > 0 and self._rng.random() < rate:
                self.faults_injected[name] = self.faults_injected.get(name, 0) + 1
                if name != "http_503":
                    p = req.plan
                    planned = p.reasoning + (1 if p.thinking else 0) + p.content + 1
                    length = min(req.sampling.max_new_tokens, planned)
                    req.fault = name
                    req.fault_at = int(length * f.fault_position)
                    req.fault_message = f.abort_message if name == "abort" else "Aborted"
                return name
        return None

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self.http_requests += 1
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            return await self._generate_inner(request)
        finally:
            self.in_flight -= 1

    async def _generate_inner(self, request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return validation_error(f"JSON decode error: {exc}")
        tok = self.tokenizer
        try:
            parsed = parse_generate(body, vocab_size=tok.vocab_size, eos_ids=tok.eos_ids)
        except GenerateError as exc:
            return exc.response
        prompt_ids = parsed.prompt_ids if parsed.prompt_ids is not None else tok.encode(parsed.text or "")
        n = len(prompt_ids)
        ctx = self.context_len
        if n >= ctx:
            return error_400(f"The input ({n} tokens) is longer than the model's context length ({ctx} tokens).")
        max_new = parsed.sampling.max_new_tokens
        if n + max_new > ctx:
            return error_400(
                f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
                f"You requested a total of {n + max_new} tokens: {n} tokens from the input messages and "
                f"{max_new} tokens for the completion. Please reduce the number of tokens in the input "
                "messages or the completion to fit within the limit."
            )
        if parsed.rid in self.scheduler.live:
            return error_400(f"Duplicate request ID detected: {parsed.rid}")
        req = self.new_req(
            parsed.rid, prompt_ids, parsed.sampling, stream=parsed.stream, log_metrics=parsed.log_metrics
        )
        if self._draw_fault(req) == "http_503":
            return http_error(503, "Service Unavailable")
        self._clients[req] = request.transport
        self.scheduler.submit(req)
        self.peak_queue = max(self.peak_queue, len(self.scheduler.waiting))
        try:
            if parsed.stream:
                return await self._stream(request, req, parsed.return_prompt_token_ids)
            return await self._wait(request, req, parsed.return_prompt_token_ids)
        finally:
            self._clients.pop(req, None)

    def out_dict(self, req: Req, *, final: bool, prompt_ids: bool = False) -> dict[str, Any]:
        """One response object: the whole text and ids so far (SGLang streams cumulatively)."""
        cfg = self.config
        if req.before_prefill:
            # The front end answers a request aborted in the queue itself, with no tokens at all.
            return {
                "text": "",
                "output_ids": [],
                "meta_info": {
                    "id": req.rid,
                    "finish_reason": req.finish,
                    "prompt_tokens": 0,
                    "completion_tokens": 0,
                    "cached_tokens": 0,
                    "weight_version": cfg.weight_version,
                },
            }
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": req.finish if final else None,
            "prompt_tokens": req.n_prompt,
            "weight_version": cfg.weight_version,
            "num_retractions": req.num_retractions,
            "reasoning_tokens": req.reasoning_tokens() if cfg.reasoning_parser else 0,
            "completion_tokens": len(req.output_ids),
            "cached_tokens": req.cached_tokens,
        }
        if final:
            end = req.finished_at if req.finished_at is not None else time.monotonic()
            meta["e2e_latency"] = end - req.arrived
        out: dict[str, Any] = {"text": req.text, "output_ids": req.output_ids, "meta_info": meta}
        if prompt_ids:
            out["prompt_token_ids"] = req.prompt_ids
        return out

    async def _wait(self, request: web.Request, req: Req, prompt_ids: bool) -> web.StreamResponse:
        while req.finish is None:
            req.event.clear()
            await req.event.wait()
        if req.dropped:
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=200)
        body = orjson.dumps(self.out_dict(req, final=True, prompt_ids=prompt_ids))
        return web.Response(status=200, body=body, content_type="application/json")

    async def _stream(self, request: web.Request, req: Req, prompt_ids: bool) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        interval = max(1, self.config.stream_interval)
        sent = 0
        try:
            await resp.prepare(request)
            while True:
                if req.finish is None and not req.dropped and len(req.output_ids) - sent < interval:
                    req.event.clear()
                    await req.event.wait()
                if req.dropped:
                    if request.transport is not None:
                        request.transport.close()
                    return resp
                if req.finish is not None:
                    break
                n = len(req.output_ids)
                if n - sent >= interval:
                    await resp.write(b"data: " + orjson.dumps(self.out_dict(req, final=False)) + b"\n\n")
                    sent = n
            final = orjson.dumps(self.out_dict(req, final=True, prompt_ids=prompt_ids))
            await resp.write(b"data: " + final + b"\n\ndata: [DONE]\n\n")
        except (ConnectionError, RuntimeError):
            # The client went away: SGLang aborts the request in the scheduler.
            self.scheduler.abort_req(req)
        return resp

    async def _sweep_clients(self) -> None:
        """Abort requests whose client has gone, as SGLang's disconnect checks do."""
        while True:
            await asyncio.sleep(0.25)
            for req, transport in list(self._clients.items()):
                if req.finish is None and (transport is None or transport.is_closing()):
                    self.scheduler.abort_req(req)
            sched = self.scheduler
            self.peak_running = max(self.peak_running, len(sched.running))
            self.peak_queue = max(self.peak_queue, len(sched.waiting))

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
            s.requests += 1
            if not req.before_prefill:
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

    def _on_watchdog(self) -> None:
        cfg = self.config
        self.log.scheduler(
            f"Scheduler watchdog timeout (self.watchdog_timeout={cfg.watchdog_timeout:g}, self.soft=False)"
        )
        self._tasks.append(asyncio.create_task(self._watchdog_kill(), name="sglang-sim-watchdog-kill"))

    async def _watchdog_kill(self) -> None:
        # SGLang waits 5 s so the parent can print the error, then signals it with SIGQUIT.
        await asyncio.sleep(5.0 * self.config.time_scale)
        await self.crash(
            EXIT_KILLED, ["Received sigquit from a child process. It usually means the child failed."]
        )

    # --- health and info -----------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.StreamResponse:
        if self.shutting_down:
            self.log.main("Health check request received during shutdown. Returning 503.")
            return web.Response(status=503)
        if self.phase != "ready":
            return web.Response(status=503)
        cfg = self.config
        sched = self.scheduler
        tic = time.monotonic()
        wall = time.time()
        probe = self.new_req(
            f"HEALTH_CHECK_{wall}",
            [0],
            Sampling(max_new_tokens=1, temperature=0.0),
            log_metrics=False,
            internal=True,
        )
        sched.submit(probe)
        deadline = tic + cfg.health_check_timeout_s * cfg.time_scale
        try:
            while sched.last_output_at <= tic:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    last = time.strftime("%H:%M:%S", time.localtime(wall - (tic - sched.last_output_at)))
                    self.log.main(
                        "Health check failed. Server couldn't get a response from detokenizer for last "
                        f"{cfg.health_check_timeout_s:g} seconds. tic start time: "
                        f"{time.strftime('%H:%M:%S', time.localtime(wall))}. last_heartbeat time: {last}"
                    )
                    return web.Response(status=503)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(sched.output_event.wait(), min(remaining, 1.0))
            return web.Response(status=200)
        finally:
            sched.abort_req(probe)

    async def _ready(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200 if self.phase in ("warmup", "ready") else 503)

    def model_info(self, legacy: bool = False) -> dict[str, Any]:
        return info.model_info(self, legacy)

    def server_info(self) -> dict[str, Any]:
        return info.server_info(self)

    def _deprecated(self, old: str, new: str) -> None:
        self.log.main(
            f"The endpoint {old} is deprecated and will be removed in a future version. Please use {new} instead."
        )

    async def _model_info(self, request: web.Request) -> web.StreamResponse:
        if self.config.info_paths == "legacy":
            return await self._not_found(request)
        return json_response(self.model_info())

    async def _get_model_info(self, request: web.Request) -> web.StreamResponse:
        legacy = self.config.info_paths == "legacy"
        if not legacy:
            self._deprecated("/get_model_info", "/model_info")
        return json_response(self.model_info(legacy=legacy))

    async def _server_info(self, request: web.Request) -> web.StreamResponse:
        if self.config.info_paths == "legacy":
            return await self._not_found(request)
        return json_response(self.server_info())

    async def _get_server_info(self, request: web.Request) -> web.StreamResponse:
        info = self.server_info()
        if self.config.info_paths == "legacy":
            info.pop("frontend", None)
        else:
            self._deprecated("/get_server_info", "/server_info")
        return json_response(info)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        return json_response({"object": "list", "data": [info.model_card(self)]})

    async def _model_card(self, request: web.Request) -> web.StreamResponse:
        model = request.match_info["model"]
        if model != self.config.served_name:
            return json_response(
                {
                    "error": {
                        "message": f"The model '{model}' does not exist",
                        "type": "invalid_request_error",
                        "param": "model",
                        "code": "model_not_found",
                    }
                },
                404,
            )
        return json_response(info.model_card(self))

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        if not self.config.enable_metrics:
            return await self._not_found(request)
        return web.Response(body=metrics.render(self), headers={"Content-Type": metrics.CONTENT_TYPE})

    # --- control -------------------------------------------------------------------------------------
    async def _json_body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return {}
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None

    async def _abort_request(self, request: web.Request) -> web.StreamResponse:
        body = await self._json_body(request)
        if not isinstance(body, dict):
            return validation_error("Input should be a valid dictionary or object")
        rid = body.get("rid")
        abort_all = body.get("abort_all") is True
        if rid is not None and not isinstance(rid, str):
            return validation_error("rid: Input should be a valid string")
        if self.config.record_ids:
            self.abort_requests.append(rid)
        self.scheduler.abort(rid, abort_all=abort_all)
        return web.Response(status=200)

    async def _flush_cache(self, request: web.Request) -> web.StreamResponse:
        sched = self.scheduler
        ok = not sched.waiting and not sched.running
        if ok:
            sched.cache.flush()
            self.log.scheduler("Cache flushed successfully!")
        else:
            self.log.scheduler(
                "Cache not flushed because there are pending requests. "
                f"#queue-req: {len(sched.waiting)}, #running-req: {len(sched.running)}"
            )
        return web.Response(
            status=200 if ok else 400,
            text="Cache flushed.\nPlease check backend logs for more details. (When there are running or "
            "waiting requests, the operation will not be performed.)\n",
        )

    async def _pause(self, request: web.Request) -> web.StreamResponse:
        self.scheduler.paused = True
        self.log.scheduler("Paused generation in place")
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def _continue(self, request: web.Request) -> web.StreamResponse:
        self.scheduler.paused = False
        self.scheduler.wake()
        self.log.scheduler("Generation continued")
        return json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def _slow_down(self, request: web.Request) -> web.StreamResponse:
        body = await self._json_body(request)
        value = body.get("forward_sleep_time") if isinstance(body, dict) else None
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool) or value < 0):
            return validation_error("forward_sleep_time: Input should be a non-negative number")
        self.apply_config(self.config.model_copy(update={"forward_sleep_s": float(value or 0.0)}))
        return web.Response(status=200)

    # --- admin ---------------------------------------------------------------------------------------
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

    async def _state_route(self, request: web.Request) -> web.StreamResponse:
        return json_response(self.state())

    async def _config_get(self, request: web.Request) -> web.StreamResponse:
        return json_response(self.config.model_dump())

    async def _config_post(self, request: web.Request) -> web.StreamResponse:
        patch = await self._json_body(request)
        if not isinstance(patch, dict):
            return json_response({"error": "the patch must be a JSON object"}, 400)
        try:
            new = patched(self.config, patch)
        except ValidationError as exc:
            return json_response({"error": problems(exc)}, 400)
        self.apply_config(new)
        return json_response({"ok": True, "config": new.model_dump()})

