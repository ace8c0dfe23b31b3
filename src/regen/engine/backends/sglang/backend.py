"""SGLang behind the backend contract: `/generate` with token ids rendered here, the server's own
output ids in the rows, GPU time as the ledger's unit, and a concurrency ceiling from `/metrics`.

docs/sglang.md §11 has the facts this relies on (the body, the stream, rids and aborts, failures,
the load targets); docs/money.md the GPU-time definition; docs/data-contract.md §5.2 the ids.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Coroutine, Iterator
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from regen.engine.backends.base import (
    AttemptOutcome,
    BackendError,
    Disposition,
    Failure,
    JobContext,
    OnHandle,
    OnRoute,
)
from regen.engine.backends.sglang import errors
from regen.engine.backends.sglang.load import (
    Capacity,
    Health,
    ServerLoad,
    capacity,
    next_ceiling,
)
from regen.engine.backends.sglang.server import ServerError, ServerFacts, read_facts
from regen.engine.backends.sglang.wire import (
    NAN_MATCHED,
    StreamTail,
    finish_type,
    read_answer,
    request_body,
    sampling_params,
    usage_of,
    worker_name,
)
from regen.engine.backends.sglang.worker import Worker
from regen.engine.config.needs import need_problems
from regen.engine.config.settings import Settings, served_model_name
from regen.engine.data.datasets import Prompt
from regen.engine.data.tokenizer import TargetTokenizer, TokenizerError, TokenizerSpec
from regen.engine.net.deadlines import Deadlines
from regen.engine.net.sglang_server import KEEPALIVE_S
from regen.engine.schema import BackendView, RouteView
from regen.engine.units import GPU_SECONDS, Unit

if TYPE_CHECKING:
    from regen.engine.host.fleet import Fleet
    from regen.engine.host.monitor import HostMonitor

# The router names the worker that served a request in this response header (docs/sglang.md §11.2).
ROUTED_WORKER_HEADER = "x-smg-routed-worker-id"
# Aborts still on their way when the backend closes get this long, so a stop never hangs on them.
ABORT_GRACE_S = 2.0
_ZERO = Decimal(0)
# Failures after which the request may still be running on the server.
_CUT = frozenset({errors.ErrorClass.NETWORK, errors.ErrorClass.STREAM_ERROR})


class SGLangBackend:
    """Generation through SGLang servers: exact token ids, GPU time, workers as routes."""

    name = "sglang"
    unit: Unit = GPU_SECONDS
    thinking_setting = "tokenizer.thinking"
    title = "SGLang"
    requests_per_minute: int | None = None  # no platform limit: the servers are the operator's
    handle_is_rid = True  # each request carries its rid, which aborts it (wire.py `request_body`)
    # Of the contract's abilities (engine/backends/base.py) only `aborts` (a request ended on its
    # server by rid): the backend picks the server of each request itself, no answer is vetoed after
    # the fact, and GPU time is measured at the attempt, so no bill ever arrives later.
    routes: None = None
    guard: None = None
    account: None = None

    def __init__(self, settings: Settings, hosts: HostMonitor | None = None) -> None:
        self.all_settings = settings
        self.hosts = hosts
        self.settings = settings.sglang
        sampling = settings.openrouter  # the sampling settings are the same for both backends
        self.max_tokens = sampling.max_tokens
        self.temperature = sampling.temperature
        self.top_p = sampling.top_p
        self.thinking = settings.tokenizer.thinking
        self.configured = settings.job.concurrency
        # The one name every server of the job serves (engine/config/settings.py `served_model_name`).
        self.served_name = served_model_name(self.settings, settings.hosts)
        self.model = self.served_name or "sglang"
        self.base_url = ", ".join(self.settings.urls)
        self.health = Health(
            self.settings.healthy_queue_min,
            self.settings.healthy_queue_max,
            self.settings.healthy_kv_usage_max,
        )
        self.tokenizer: TargetTokenizer | None = None
        self.workers: list[Worker] = []
        # Behind the router (several hosts): where requests go; `workers` are then the hosts behind it,
        # read directly through their tunnels for load, aborts and the view.
        self.entry: Worker | None = None
        self.fleet: Fleet | None = None
        self._by_url: dict[str, Worker] = {}
        self.ceiling: int | None = None
        self.ceiling_reason = ""
        self.watch_error: str | None = None
        self._sampling: dict[str, Any] = {}
        self._session: aiohttp.ClientSession | None = None
        self._context: JobContext | None = None
        self._deadlines = Deadlines(self.settings.read_timeout_s, self.settings.request_timeout_s)
        self._turn = itertools.count()
        self._aborts: set[asyncio.Task[None]] = set()
        # When (monotonic) a chunk of any answer last arrived: a fleet that streams is not silent,
        # however long its answers take (engine/job/stall.py).
        self._heard: float | None = None
        self._control_timeout = aiohttp.ClientTimeout(
            total=max(5.0, self.settings.connect_timeout_s), sock_connect=self.settings.connect_timeout_s
        )
        self._request = {
            "thinking": self.thinking,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "min_p": None,
            "seed": None,
            "stream": True,
        }
        self._server: dict[str, Any] = {"kind": "sglang", "endpoint": "/generate"}

    # ------------------------------------------------------------------------------ lifecycle

    def check(self) -> None:
        problems = need_problems(self.all_settings, "run")
        if not problems and self.all_settings.tokenizer.path is None:
            # `regen run` fetches it from a host before the job starts (cli/main.py); a job made
            # any other way must be given one.
            problems.append(
                "tokenizer.path: empty: set it to the model's tokenizer folder, or run regen pull"
            )
        if problems:
            raise BackendError("; ".join(problems))

    async def open(self, context: JobContext) -> None:
        self.check()
        self._context = context
        spec = TokenizerSpec.from_settings(self.all_settings.tokenizer)
        try:
            self.tokenizer = await asyncio.to_thread(TargetTokenizer, spec)
        except TokenizerError as exc:
            raise BackendError(str(exc)) from None
        self._sampling = sampling_params(
            self.max_tokens, self.temperature, self.top_p, self.tokenizer.end_of_turn_id
        )
        # Idle connections close before the server closes them (engine/net/sglang_server.py).
        connector = aiohttp.TCPConnector(
            limit=self.configured + 16, limit_per_host=0, keepalive_timeout=KEEPALIVE_S
        )
        # Only the connect limit is aiohttp's; an attempt's idle and total limits are the sweeper's
        # (engine/net/deadlines.py), which costs one task instead of a timer per request.
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(sock_connect=self.settings.connect_timeout_s),
            headers={"Content-Type": "application/json"},
            read_bufsize=2**18,
        )
        try:
            urls, names = await self._server_urls()
            facts = await asyncio.gather(
                *(read_facts(self._session, url, self._control_timeout) for url in urls)
            )
            self.workers = self._check_servers(urls, facts, names)
        except (ServerError, BackendError) as exc:
            await self.close()
            raise BackendError(str(exc)) from None
        self._by_url = {w.url: w for w in self.workers}
        if self.fleet is not None and self.fleet.router is not None:
            gpus = sum(w.meter.gpus for w in self.workers)
            self.entry = Worker(self.fleet.entry_url, self.workers[0].facts, gpus, name="router")
            self.base_url = self.fleet.entry_url
        first = self.workers[0].facts
        served = first.served_model_name or self.served_name
        # One name for the model whatever the folders' paths (docs/data-contract.md §3.2 `model`).
        self.model = served or first.model_path or "sglang"
        identity = self.fleet.model if self.fleet is not None else None
        self._server = {
            "kind": "sglang",
            "version": first.version,
            "served_model_name": served,
            "weight_version": first.weight_version,
            "endpoint": "/generate",
        }
        if identity is not None:
            # The model by content, taken on the hosts (docs/data-contract.md §3.2); servers given
            # as sglang.urls cannot be read there, so their rows have no digest.
            self._server["model_digest"] = identity.digest

    async def _server_urls(self) -> tuple[list[str], dict[str, str]]:
        """The servers to talk to: `sglang.urls`, or each [[hosts]] server through a tunnel of its own
        (and the router in front of them with several hosts), opened here over the job's SSH connections."""
        if self.settings.urls:
            return list(self.settings.urls), {}
        from regen.engine.host.errors import HostError

        self.fleet = self._fleet()
        try:
            await self.fleet.open()
        except HostError as exc:
            raise BackendError(str(exc)) from None
        names = self.fleet.names
        self.base_url = self.fleet.entry_url
        return list(names), names

    def _fleet(self) -> Fleet:
        """The hosts' tunnels, or with no [[hosts]] the [[clusters]]' nodes (docs/clusters.md)."""
        settings = self.all_settings
        if not settings.hosts and settings.clusters:
            from regen.engine.cluster.fleet import ClusterFleet
            from regen.engine.cluster.kinds import cluster_of

            fleet = ClusterFleet(
                self.settings,
                [cluster_of(c, self.settings) for c in settings.clusters],
                run_dir=settings.job.run_dir,
                on_event=self._event,
            )
            fleet.on_join = self._joined
            fleet.on_leave = self._left
            return fleet
        from regen.engine.host.fleet import Fleet

        return Fleet(
            self.settings,
            settings.hosts,
            run_dir=settings.job.run_dir,
            monitor=self.hosts,
            on_reopen=self._reopened,
            on_event=self._event,
        )

    async def _joined(self, url: str, name: str) -> bool:
        """A node that became ready while the job runs: read it, check it is one with the others
        (model, version, served name), and count it; False (and the reason journaled) when not."""
        session = self._session
        if session is None or not self.workers:
            return False
        try:
            fact = await read_facts(session, url, self._control_timeout)
            first = self.workers[0]
            joined = self._check_servers([first.url, url], [first.facts, fact], {url: name})[1]
        except (ServerError, BackendError) as exc:
            self._event("node_refused", host=name, reason=str(exc)[:200])
            return False
        self.workers.append(joined)
        self._by_url[joined.url] = joined
        self._regauge()
        return True

    def _left(self, name: str) -> None:
        """A node's server is gone for good: its slots and GPUs no longer count."""
        for worker in self.workers:
            if worker.name == name:
                worker.gone = True
        self._regauge()

    def _regauge(self) -> None:
        if self.entry is not None:
            self.entry.meter.resize(sum(w.meter.gpus for w in self.workers if not w.gone))

    def _event(self, name: str, /, **fields: Any) -> None:
        if self._context is not None:
            self._context.event(name, **fields)

    def _reopened(self, url: str) -> None:
        """A tunnel carries requests again: ask that server now, which aborts the rids the drop cut off."""
        worker = self._by_url.get(url)
        if worker is not None and self._session is not None:
            task = asyncio.get_running_loop().create_task(self._poll(worker))
            self._aborts.add(task)
            task.add_done_callback(self._aborts.discard)

    def _check_servers(
        self, urls: list[str], facts: list[ServerFacts], names: dict[str, str]
    ) -> list[Worker]:
        """One model, one version, one weight version behind every URL, or the rows would lie."""
        wanted = self.served_name
        for url, fact in zip(urls, facts, strict=True):
            if wanted is not None and fact.served_model_name is not None and fact.served_model_name != wanted:
                setting = (
                    "sglang.served_model_name" if self.settings.served_model_name else "the served model name"
                )
                raise BackendError(f"{url} serves {fact.served_model_name!r}, not {setting} = {wanted!r}")
            context = fact.context_length
            if context is not None and self.max_tokens >= context:
                raise BackendError(
                    f"openrouter.max_tokens ({self.max_tokens}) does not fit {url}'s context length ({context})"
                )
        # Servers on [[hosts]] were checked to hold one model by content (engine/host/identity.py),
        # whatever their paths; for sglang.urls the path is all regen can see.
        keys = ["version", "weight_version", "served_model_name"] + (
            ["model_path"] if self.fleet is None else []
        )
        for key in keys:
            seen = {getattr(f, key) for f in facts if getattr(f, key) is not None}
            if len(seen) > 1:
                where = (
                    "sglang.urls"
                    if self.settings.urls
                    else "[[hosts]]"
                    if self.all_settings.hosts
                    else "[[clusters]]"
                )
                raise BackendError(f"the servers in {where} disagree on {key}: {', '.join(sorted(seen))}")
        return [
            Worker(url, fact, fact.gpus or self.settings.tp, names.get(url))
            for url, fact in zip(urls, facts, strict=True)
        ]

    async def close(self) -> None:
        if self._aborts:
            # Best effort: aborts get a moment to leave, never the power to hold up a stop.
            await asyncio.wait(list(self._aborts), timeout=ABORT_GRACE_S)
            for task in list(self._aborts):
                task.cancel()
            await asyncio.gather(*self._aborts, return_exceptions=True)
        await self._deadlines.close()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
        if self.fleet is not None:
            fleet, self.fleet = self.fleet, None
            await fleet.close()

    # ------------------------------------------------------------------------------- servers

    def _pick(self) -> Worker:
        if self.entry is not None:
            return self.entry
        workers = self.workers
        if len(workers) == 1:
            return workers[0]
        up = [w for w in workers if not w.down] or workers
        least = min(w.meter.in_flight for w in up)
        tied = [w for w in up if w.meter.in_flight == least]
        return tied[next(self._turn) % len(tied)]

    # ------------------------------------------------------------------------------- attempts

    async def alive(self) -> bool:
        """/health_generate of every server (or the router) at once: True at the first status line
        below 500, without waiting for its body (docs/faults.md, outages)."""
        session = self._session
        if session is None:
            return False

        async def ask(worker: Worker) -> bool:
            try:
                async with session.get(worker.health_url, timeout=self._control_timeout) as resp:
                    return resp.status < 500
            except (aiohttp.ClientError, OSError, TimeoutError):
                return False

        asks = [asyncio.ensure_future(ask(worker)) for worker in self._every()]
        try:
            for answer in asyncio.as_completed(asks):
                if await answer:
                    self._answered(generation=False)
                    return True
            return False
        finally:
            for pending in asks:
                pending.cancel()

    def _answered(self, *, generation: bool) -> None:
        """A status line from a server: the job's sign of life (JobContext.answered)."""
        if self._context is not None:
            self._context.answered(generation)

    def reservation(self, prompt: Prompt) -> Decimal:
        # A GPU-time ledger has no budget to hold back from; an attempt cut by a cancel or a
        # crash is charged this (nothing), docs/money.md.
        return _ZERO

    async def attempt(
        self, prompt: Prompt, rid: str, on_handle: OnHandle, on_route: OnRoute
    ) -> AttemptOutcome:
        tokenizer, session = self.tokenizer, self._session
        assert tokenizer is not None and session is not None, "the backend is not open"
        worker = self._pick()
        outcome = AttemptOutcome(
            route=worker.name, handle=rid, served_model=self._server.get("served_model_name")
        )
        # The rid names the attempt before it leaves: a crash from here on can still abort it.
        on_handle(rid)
        on_route(worker.name)
        try:
            prompt_ids = tokenizer.render_ids(prompt.request_messages)
        except Exception as exc:
            outcome.failure = Failure(
                Disposition.GIVE_UP,
                errors.ErrorClass.BAD_PROMPT,
                f"the chat template cannot render this prompt: {type(exc).__name__}: {exc}"[:300],
                sent=False,
            )
            return outcome
        outcome.prompt_ids = prompt_ids
        context = worker.facts.context_length
        if context is not None and len(prompt_ids) + self.max_tokens > context:
            # Rendered here, so its length is known: the server would only refuse it.
            outcome.failure = errors.over_context(len(prompt_ids), self.max_tokens, context, worker.url)
            return outcome
        body = request_body(prompt_ids, self._sampling, rid)
        deadlines = self._deadlines
        meter = worker.meter
        started = time.monotonic()
        mark = meter.enter(started)
        worker.live.add(rid)
        watch = deadlines.watch()
        # A queued request hears nothing until it runs: the idle limit starts at the first chunk.
        watch.idle_exempt = True
        tail = StreamTail()
        status: int | None = None
        failure: Failure | None = None
        served_by: Worker | None = None
        try:
            async with session.post(worker.generate_url, data=body) as resp:
                status = resp.status
                if status < 500:
                    self._answered(generation=True)
                routed = resp.headers.get(ROUTED_WORKER_HEADER)
                if routed:
                    served_by = self._by_url.get(routed.rstrip("/"))
                    outcome.route = served_by.name if served_by is not None else worker_name(routed)
                    on_route(outcome.route)
                if status != 200:
                    raw = await resp.read()
                    try:
                        parsed = orjson.loads(raw) if raw else None
                    except orjson.JSONDecodeError:
                        parsed = None
                    failure = errors.for_status(status, parsed, raw, worker.url)
                else:
                    async for block in resp.content.iter_any():
                        self._heard = time.monotonic()
                        if outcome.ttft_s is None:
                            outcome.ttft_s = self._heard - started
                            watch.idle_exempt = False
                        watch.received += len(block)
                        tail.feed(block)
                    tail.finish()
        except asyncio.CancelledError:
            if not deadlines.absorb(watch):
                # A stop with cancel: the server must stop generating it too, without holding us up.
                self._abort_soon(served_by or worker, rid)
                raise
            failure = errors.network(f"{deadlines.reason(watch)} ({worker.url})")
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:  # TimeoutError: the connect limit
            failure = errors.for_exception(exc, worker.url)
        finally:
            deadlines.unwatch(watch)
            worker.live.discard(rid)
            gpu_s = meter.leave(mark)
        outcome.e2e_s = time.monotonic() - started
        outcome.journal = {"http": status}
        if failure is None:
            failure = self._read(outcome, tail, worker, tokenizer)
        if failure is not None:
            if failure.outage:
                worker.down = True  # other URLs take the next attempts until a poll reaches it
            elif failure.sent and failure.error_class in _CUT:
                # The server may still be generating what nobody will read: aborted on the server
                # that had it (behind the router, the one it named) once that server answers again.
                (served_by or worker).orphans.add(rid)
        outcome.failure = failure
        outcome.cost = _ZERO if failure is not None and not failure.sent else Decimal(f"{gpu_s:.6f}")
        return outcome

    def _read(
        self, outcome: AttemptOutcome, tail: StreamTail, worker: Worker, tokenizer: TargetTokenizer
    ) -> Failure | None:
        """The final chunk into the outcome (docs/data-contract.md §5.2), or why it is no answer."""
        if tail.last is None:
            return errors.network(f"the stream from {worker.url} ended before any chunk")
        try:
            answer = read_answer(tail.last)
        except ValueError as exc:
            return errors.network(f"{exc} ({worker.url})")
        if answer.error is not None:
            return errors.for_stream_error(answer.error, worker.url)
        outcome.native_finish_reason = answer.finish
        outcome.usage = usage_of(answer.meta)
        kind = finish_type(answer.finish)
        if kind is None:
            return errors.network(f"the stream from {worker.url} ended before its final chunk")
        if kind == "abort":
            assert isinstance(answer.finish, dict)
            return errors.for_abort(answer.finish, worker.url)
        if kind == "stop" and isinstance(answer.finish, dict) and answer.finish.get("matched") == NAN_MATCHED:
            return errors.nan(worker.url)
        outcome.finish_reason = kind
        ids = answer.output_ids
        eot = tokenizer.end_of_turn_id
        # Every ok row ends with the turn terminator, whether or not the server kept the stop id.
        if kind == "stop" and (not ids or ids[-1] != eot):
            ids.append(eot)
            outcome.terminator_appended = True
        outcome.output_ids = ids
        # /generate returns raw text (the matched stop id trimmed); the first </think> splits it.
        outcome.reasoning, outcome.content = tokenizer.split_text(answer.text)
        return None

    def charge(self, outcome: AttemptOutcome, reserved: Decimal) -> tuple[Decimal, bool]:
        """The attempt's share of its server's GPU time (docs/money.md), measured, never estimated."""
        if outcome.failure is not None and not outcome.failure.sent:
            return _ZERO, False
        return (outcome.cost if outcome.cost is not None else _ZERO), False

    def describe_fatal(self, failure: Failure) -> str:
        if failure.error_class == errors.ErrorClass.AUTH:
            return (
                f"the SGLang server refuses regen's requests ({failure.message}); start it without --api-key"
            )
        if failure.error_class == errors.ErrorClass.NOT_FOUND:
            return (
                f"{failure.message}: sglang.urls must name SGLang servers' native API (or the router), "
                f"serving {self.served_name or 'the model'}"
            )
        return f"{failure.error_class}: {failure.message}"

    def row_request(self) -> dict[str, Any]:
        return self._request

    def row_server(self) -> dict[str, Any]:
        return self._server

    # ------------------------------------------------------------------------------- aborts

    @property
    def aborts(self) -> SGLangBackend:
        return self

    def heard_at(self) -> float | None:
        return self._heard

    def stall_sign(self, now: float) -> str | None:
        """Every server that may hold requests of ours shows its own sign of a stall
        (engine/backends/sglang/worker.py `sign_at`): their words, joined; None while one does not.
        Those holding requests; behind regen's router (which answers for itself and is not polled),
        every server of the fleet, since the router may have sent them to any."""
        entry = self.entry
        if entry is not None:
            holding = [w for w in self.workers if not w.gone] if entry.meter.in_flight > 0 else []
        else:
            holding = [w for w in self.workers if w.meter.in_flight > 0 and not w.gone]
        signs = [w.sign_at(now) for w in holding]
        if not signs or any(sign is None for sign in signs):
            return None
        return "; ".join(sign for sign in signs if sign is not None)

    def abort(self, rid: str) -> None:
        """/abort_request for `rid` on the server it was sent to (the router, when there is one),
        in the background: the attempt then comes back with the server's answer to it (docs/sglang.md
        §5; a request still queued there ends at once with "Abort in waiting queue")."""
        worker = next((w for w in self._every() if rid in w.live), None)
        if worker is not None:
            self._abort_soon(worker, rid)

    def _abort_soon(self, worker: Worker, rid: str) -> None:
        """Send /abort_request for `rid` in the background (best effort)."""
        if self._session is None:
            return
        task = asyncio.get_running_loop().create_task(self._abort(worker, rid))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def _abort(self, worker: Worker, rid: str) -> None:
        # SGLang aborts every live request whose rid *starts with* the one named (docs/sglang.md §5):
        # never name a rid that is a prefix of another one in flight here ("B-1#1" of "B-1#10").
        if any(other != rid and other.startswith(rid) for w in self._every() for other in w.live):
            worker.orphans.add(rid)
            return
        session = self._session
        if session is None:
            return
        try:
            async with session.post(
                worker.abort_url, data=orjson.dumps({"rid": rid}), timeout=self._control_timeout
            ) as resp:
                await resp.read()
                if resp.status == 404:
                    worker.abort_missing = True  # a router that does not pass /abort_request on
                worker.orphans.discard(rid)
        except (aiohttp.ClientError, OSError, TimeoutError):
            worker.orphans.add(rid)  # sent again once the server answers

    def _every(self) -> Iterator[Worker]:
        if self.entry is not None:
            yield self.entry
        yield from self.workers

    # ------------------------------------------------------------------------------- watching

    def tasks(self) -> list[Coroutine[Any, Any, None]]:
        # Called as the run starts, before anything is sent: the servers' slots (read at open)
        # bound the in-flight limit from the first request, not from the first scrape on.
        self._steer()
        return [self._watch()] + ([self.fleet.watch()] if self.fleet is not None else [])

    async def _watch(self) -> None:
        """Scrape every server's /metrics, one round at a time (never two at once), and steer."""
        while True:
            try:
                await self.poll()
                self._steer()
            except Exception as exc:  # a surprise in one round must not end the watching
                self.watch_error = f"{type(exc).__name__}: {exc}"[:200]
            await asyncio.sleep(self.settings.metrics_interval_s)

    async def poll(self) -> None:
        await asyncio.gather(*(self._poll(worker) for worker in self.workers if not worker.gone))

    async def _poll(self, worker: Worker) -> None:
        session = self._session
        if session is None:
            return
        if await worker.scrape(session, self._control_timeout):
            self._answered(generation=False)
        if worker.orphans:
            orphans = list(worker.orphans)
            worker.orphans.clear()
            await asyncio.gather(*(self._abort(worker, rid) for rid in orphans))

    def _steer(self) -> None:
        """Suggest the in-flight ceiling that keeps the servers' queues and KV pools healthy."""
        context = self._context
        scraped: list[tuple[ServerLoad, int]] = []
        for worker in self.workers:
            load = worker.load
            if load is None or worker.gone:
                continue
            seen = worker.retracted_seen
            worker.retracted_seen = load.retracted_total
            scraped.append((load, 0 if seen is None else max(0, int(load.retracted_total - seen))))
        servers = self.capacity()
        if context is None or (not scraped and servers is None):
            return
        in_flight = sum(w.meter.in_flight for w in self._every())
        proposed, reason = next_ceiling(
            scraped, in_flight, self.ceiling, self.configured, self.health, servers
        )
        if proposed == self.ceiling:
            return
        self.ceiling = proposed
        self.ceiling_reason = reason
        context.suggest_concurrency(proposed, reason)

    def capacity(self) -> Capacity | None:
        """The running slots of the servers that take requests now (every one while all are down),
        and the queue they may hold (engine/backends/sglang/load.py); None while one's are unknown."""
        here = [w for w in self.workers if not w.gone] or self.workers
        up = [w for w in here if not w.down] or here
        return capacity(w.slots for w in up)

    # --------------------------------------------------------------------------------- view

    def view(self) -> BackendView:
        routes: list[RouteView] = [
            {
                "name": w.name,
                "slug": w.name,
                "allowed": True,
                "kept_out": "gone" if w.gone else "down" if w.down else None,
                "reason": w.error,
                "prompt_per_m": None,
                "completion_per_m": None,
                "precision": None,
            }
            for w in self.workers
        ]
        return {
            "name": self.name,
            "unit": self.unit,
            "model": self.model,
            "routes": routes,
            "account": {
                "kind": "sglang",
                "servers": [w.view() for w in self.workers],
                "gpu_s": round(sum(w.meter.busy_gpu_s() for w in self._every()), 3),
                "router": self.entry.view() if self.entry is not None else None,
                "fleet": self.fleet.view() if self.fleet is not None else None,
                "concurrency_ceiling": self.ceiling,
                "ceiling_reason": self.ceiling_reason,
                "watch_error": self.watch_error,
            },
        }


__all__ = ["SGLangBackend"]
