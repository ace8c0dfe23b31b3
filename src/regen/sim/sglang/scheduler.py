"""The scheduler model: a running batch of bounded size, a queue behind it, a KV token pool.

It follows SGLang's scheduler loop closely enough that load shows up the same way (docs/sglang.md,
"Scheduler model"):

- Each forward is either a prefill of newly admitted requests (which also yields their first id) or
  one decode step for the whole running batch. A decode step's time per token is the larger of one
  request's own rate and the batch's share of the aggregate rate, so per-request speed falls as the
  batch grows and throughput saturates at `max_gen_throughput`.
- Admission is first come, first served while the batch has room and the pool can hold the prompt
  plus `new_token_ratio` of every running request's remaining `max_new_tokens`. The ratio decays
  step by step towards its floor, so the scheduler gets bolder until the pool runs out.
- When a decode step needs more tokens than the pool has, requests are retracted (fewest output ids
  first, longest prompt among equals), put back at the head of the queue with their output kept, and
  the ratio jumps, exactly the "KV cache pool is full. Retract requests." episode.
- A forward shorter than `min_step_s` carries several ids per request, so the simulator's cost
  follows forwards, not tokens. Forwards run on the simulated GPU's own clock: a simulator late
  to start one (a busy machine) makes up the ids the GPU made meanwhile, so the GPU keeps its
  speed while chunks get larger, up to half a second of lateness; beyond that the simulator is
  the bottleneck and the figure in bench/sglang_sim_capacity.py says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from regen.sim.sglang.config import SimSGLangConfig
from regen.sim.sglang.logs import SimLog
from regen.sim.sglang.request import ABORT_IN_WAITING_QUEUE, Req, finish_abort, finish_length
from regen.sim.sglang.stats import Stats

__all__ = ["RadixCache", "Scheduler", "soft_watchdog_line"]

_INIT_NEW_TOKEN_RATIO = 0.7
_MIN_NEW_TOKEN_RATIO = 0.14
_NEW_TOKEN_RATIO_DECAY_STEPS = 600
_RETRACT_DECODE_STEPS = 20
_MAX_TOKENS_PER_FORWARD = 256
_MAX_LATE_S = 0.5


class RadixCache:
    """Prefix reuse at block granularity: a prompt's cached tokens are its longest prefix of whole
    blocks seen before. Bounded; the oldest blocks are forgotten first."""

    def __init__(self) -> None:
        self._blocks: dict[int, None] = {}
        self.hit_tokens = 0
        self.total_tokens = 0

    def _hashes(self, ids: list[int], block: int) -> list[int]:
        out: list[int] = []
        h = 0
        for start in range(0, len(ids) - block + 1, block):
            h = hash((h, tuple(ids[start : start + block])))
            out.append(h)
        return out

    def match(self, ids: list[int], block: int) -> int:
        n = 0
        for h in self._hashes(ids, block):
            if h not in self._blocks:
                break
            n += block
        # The last prompt token is always recomputed: its logits give the first output id.
        return min(n, max(0, len(ids) - 1))

    def insert(self, ids: list[int], block: int, cap: int) -> None:
        for h in self._hashes(ids, block):
            self._blocks.pop(h, None)
            self._blocks[h] = None
        while len(self._blocks) > cap:
            del self._blocks[next(iter(self._blocks))]

    def flush(self) -> None:
        self._blocks.clear()

    def hit_rate(self) -> float:
        return self.hit_tokens / self.total_tokens if self.total_tokens else 0.0


@dataclass(slots=True)
class _Window:
    """The decode-log window: SGLang reports throughput every decode_log_interval forwards."""

    started: float = field(default_factory=time.monotonic)
    tokens: int = 0
    forwards: int = 0


class Scheduler:
    """Owns the queue, the batch and the pool. `config` is read on every forward."""

    def __init__(
        self,
        config: Callable[[], SimSGLangConfig],
        stats: Stats,
        log: SimLog,
        on_finish: Callable[[Req], None],
        on_watchdog: Callable[[], None],
    ) -> None:
        self._config = config
        self.stats = stats
        self.log = log
        self._on_finish = on_finish
        self._on_watchdog = on_watchdog
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.live: dict[str, Req] = {}
        self.kv_used = 0
        self.forward_ct = 0
        self.in_forward = False  # a batch is being run (what the watchdog looks at)
        self.paused = False
        self.hung = False  # the watchdog fault: every forward from now on hangs
        self.cache = RadixCache()
        self.last_output_at = 0.0
        self._clock = time.monotonic()  # the simulated GPU's time: when its current forward ends
        self.output_event = asyncio.Event()
        self._wake = asyncio.Event()
        self._window = _Window()
        self.new_token_ratio = self._init_ratio()
        self._task: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self.admitted_total = 0
        self._dealt = 0  # requests dealt to the data-parallel ranks in turn

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sglang-sim-scheduler")
        self._watchdog = asyncio.create_task(self._watch(), name="sglang-sim-watchdog")

    async def close(self) -> None:
        for task in (self._task, self._watchdog):
            if task is not None:
                task.cancel()
        for task in (self._task, self._watchdog):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._watchdog = None

    def wake(self) -> None:
        self._wake.set()

    def reset_ratio(self) -> None:
        """schedule_conservativeness changed: start again from its initial ratio."""
        self.new_token_ratio = self._init_ratio()

    # --- requests --------------------------------------------------------------------------------
    def submit(self, req: Req) -> None:
        req.arrived = time.monotonic()
        req.status = "waiting"
        req.dp_rank = self._dealt % max(1, self._config().dp_size)
        self._dealt += 1
        limit = self._config().max_queued_requests
        if limit is not None and not req.internal and len(self.waiting) + 1 > limit:
            # --max-queued-requests: the newcomer is refused with a 503 abort (scheduler.py
            # `_abort_on_queued_limit`), answered by the front end as an abort in the queue.
            req.in_queue_abort = True
            req.finish = {"type": "abort", "status_code": 503, "message": "The request queue is full."}
            req.status = "finished"
            req.finished_at = time.monotonic()
            self._on_finish(req)
            req.event.set()
            return
        self.waiting.append(req)
        self.live[req.rid] = req
        self._wake.set()

    def abort(self, rid: str | None, abort_all: bool = False, message: str = "Aborted") -> list[str]:
        """SGLang's /abort_request: a known rid aborts every live request whose rid starts with it
        (the scheduler matches by prefix); abort_all aborts everything. A request in the waiting
        queue (a retracted one too) is answered by the front end: "Abort in waiting queue" with the
        output it had; a running one ends with its output so far."""
        if not abort_all and (rid is None or rid not in self.live):
            return []
        hit = [r for r in self.live.values() if abort_all or (rid is not None and r.rid.startswith(rid))]
        for req in hit:
            if req.status == "waiting":
                self.waiting.remove(req)
                req.in_queue_abort = True
                req.finish = {"type": "abort", "message": ABORT_IN_WAITING_QUEUE}
            else:
                req.finish = finish_abort(message)
            self._end(req)
        if hit:
            self.running = [r for r in self.running if r.finish is None]
            self._wake.set()
        return [r.rid for r in hit]

    def abort_req(self, req: Req, message: str = "Aborted") -> None:
        """End one request (a client that went away, an injected fault)."""
        if req.finish is not None:
            return
        if req.status == "waiting":
            self.waiting.remove(req)
        req.finish = finish_abort(message)
        self._end(req)
        self.running = [r for r in self.running if r.finish is None]
        self._wake.set()

    def _end(self, req: Req) -> None:
        if req.status == "running":
            self.kv_used -= req.kv_tokens
        req.status = "finished"
        req.finished_at = time.monotonic()
        self.live.pop(req.rid, None)
        self._on_finish(req)
        req.event.set()

    # --- the loop --------------------------------------------------------------------------------
    def _init_ratio(self) -> float:
        c = self._config().schedule_conservativeness
        return min(1.0, _INIT_NEW_TOKEN_RATIO * c)

    def _min_ratio(self) -> float:
        c = self._config().schedule_conservativeness
        return min(self._init_ratio(), _MIN_NEW_TOKEN_RATIO * c)

    def _should_hang(self, cfg: SimSGLangConfig) -> bool:
        f = cfg.faults
        if f.stall or self.hung:
            return True
        ready_at = self.stats.ready_at
        if (
            f.watchdog_after_s is not None
            and ready_at is not None
            and time.monotonic() - ready_at >= f.watchdog_after_s * cfg.time_scale
        ):
            self.hung = True
        return self.hung

    async def _run(self) -> None:
        while True:
            cfg = self._config()
            if self.paused or (not self.waiting and not self.running):
                self.in_forward = False
                self._wake.clear()
                await self._wake.wait()
                self._clock = time.monotonic()  # an idle GPU starts its next forward now
                continue
            if self._should_hang(cfg):
                # The forward never returns: ids stop, the pool stays held, the watchdog sees it.
                self.in_forward = True
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 0.05)
                self._clock = time.monotonic()
                continue
            batch = self._admit(cfg)
            limit = cfg.faults.watchdog_after_requests
            if batch and limit is not None and self.admitted_total > limit:
                # The forward carrying the request past the limit is the one that never returns.
                self.hung = True
                self._hang_batch(batch)
                continue
            if batch:
                await self._prefill(batch, cfg)
            elif self.running:
                await self._decode(cfg)
            else:
                self._refuse_head(cfg)

    def _hang_batch(self, batch: list[Req]) -> None:
        for req in batch:
            req.status = "running"
            self.kv_used += req.kv_tokens
            self.running.append(req)

    def _reserved(self, ratio: float) -> int:
        return sum(
            math.ceil(ratio * max(0, r.sampling.max_new_tokens - len(r.output_ids))) for r in self.running
        )

    def _admit(self, cfg: SimSGLangConfig) -> list[Req]:
        if not self.waiting or len(self.running) >= cfg.running_cap:
            return []
        ratio = self.new_token_ratio
        room = cfg.max_total_tokens - self.kv_used - self._reserved(ratio)
        batch: list[Req] = []
        prefill_tokens = 0
        while self.waiting and len(self.running) + len(batch) < cfg.running_cap:
            req = self.waiting[0]
            remaining = max(0, req.sampling.max_new_tokens - len(req.output_ids))
            need = req.kv_tokens + math.ceil(ratio * remaining)
            if need > room and (self.running or batch):
                break
            if batch and prefill_tokens + req.kv_tokens > cfg.max_prefill_tokens:
                break
            if req.kv_tokens + 1 > cfg.max_total_tokens:
                break  # cannot ever fit: _refuse_head ends it
            self.waiting.popleft()
            batch.append(req)
            if not req.internal and req.admitted_at is None:
                self.admitted_total += 1
            room -= need
            prefill_tokens += req.kv_tokens
        return batch

    def _refuse_head(self, cfg: SimSGLangConfig) -> None:
        req = self.waiting[0]
        self.log.scheduler(
            f"Decode out of memory. Try to lower your batch size. rid={req.rid}, "
            f"#tokens: {req.kv_tokens}, max_total_num_tokens={cfg.max_total_tokens}",
            level="error",
        )
        self.waiting.popleft()
        req.finish = finish_abort(
            f"The request needs {req.kv_tokens + 1} KV tokens; the pool holds {cfg.max_total_tokens}.",
            503,
            "ServiceUnavailable",
        )
        self._end(req)

    async def _forward(self, seconds: float, cfg: SimSGLangConfig) -> None:
        """Run a forward of `seconds` on the simulated GPU's own clock. The clock runs on from the
        previous forward, so the time the simulator spends between forwards (writing chunks) is
        not added to the GPU's; a forward that starts late simply sleeps less."""
        self.in_forward = True
        now = time.monotonic()
        end = self._clock + seconds + cfg.forward_sleep_s
        await asyncio.sleep(max(0.0, end - now))
        self._clock = end
        self.forward_ct += 1

    def _behind(self, per_token: float) -> int:
        """Tokens' worth of GPU time the simulator is late by (it was too busy to keep up)."""
        late = time.monotonic() - self._clock
        if late > _MAX_LATE_S:
            # Past this the simulator is the bottleneck: time lost is lost, not made up in one burst.
            self._clock = time.monotonic() - _MAX_LATE_S
            late = _MAX_LATE_S
        return max(0, int(late / per_token))

    async def _prefill(self, batch: list[Req], cfg: SimSGLangConfig) -> None:
        block = cfg.cache_block_tokens
        new_tokens = cached = 0
        now = time.monotonic()
        for req in batch:
            if not req.prefilled and cfg.radix_cache:
                req.cached_tokens = self.cache.match(req.prompt_ids, block)
                if req.log_metrics:
                    self.cache.hit_tokens += req.cached_tokens
                    self.cache.total_tokens += req.n_prompt
            recompute = req.kv_tokens - (0 if req.prefilled else req.cached_tokens)
            new_tokens += recompute
            cached += req.kv_tokens - recompute
            req.status = "running"
            if req.admitted_at is None:
                req.admitted_at = now
                if req.log_metrics and not req.internal:
                    self.stats.observe_queue(now - req.arrived)
            self.kv_used += req.kv_tokens
            self.running.append(req)
        self.log.scheduler(
            f"Prefill batch, #new-seq: {len(batch)}, #new-token: {new_tokens}, "
            f"#cached-token: {cached}, token usage: {self.kv_used / cfg.max_total_tokens:.2f}, "
            f"#running-req: {len(self.running) - len(batch)}, #queue-req: {len(self.waiting)}"
        )
        seconds = new_tokens / cfg.prefill_tokens_per_s * cfg.time_scale / cfg.speed
        await self._forward(seconds, cfg)
        produced = 0
        for req in batch:
            if req.finish is not None:
                continue  # aborted during the forward
            if cfg.radix_cache and not req.prefilled:
                self.cache.insert(req.prompt_ids, block, cfg.cache_max_blocks)
            req.prefilled = True
            if req.sampling.max_new_tokens <= len(req.output_ids):
                req.finish = finish_length(req.sampling.max_new_tokens)
            else:
                self._emit(req, 1)
                produced += 1
        self._settle(produced)

    async def _decode(self, cfg: SimSGLangConfig) -> None:
        n = len(self.running)
        per_token = (
            max(1.0 / cfg.decode_tokens_per_s, n / cfg.max_gen_throughput) * cfg.time_scale / cfg.speed
        )
        k = min(_MAX_TOKENS_PER_FORWARD, max(1, math.ceil(cfg.min_step_s / per_token)))
        if self.kv_used + n * k > cfg.max_total_tokens:
            self._retract(cfg, k)
            if not self.running:
                return
        else:
            self.new_token_ratio = max(
                self._min_ratio(),
                self.new_token_ratio
                - (self._init_ratio() - self._min_ratio()) / _NEW_TOKEN_RATIO_DECAY_STEPS,
            )
        # A late start (a busy machine) makes up the ids the simulated GPU made meanwhile.
        k = min(_MAX_TOKENS_PER_FORWARD, k + self._behind(per_token))
        k = max(1, min(k, (cfg.max_total_tokens - self.kv_used) // max(1, n)))
        await self._forward(k * per_token, cfg)
        produced = 0
        for req in self.running:
            if req.finish is None:
                produced += self._emit(req, k)
        self._settle(produced)
        w = self._window
        w.forwards += 1
        w.tokens += produced
        if w.forwards >= cfg.decode_log_interval:
            elapsed = max(1e-9, time.monotonic() - w.started)
            self.stats.gen_throughput = w.tokens / elapsed
            self.log.scheduler(
                f"Decode batch, #running-req: {len(self.running)}, #token: {self.kv_used}, "
                f"token usage: {self.kv_used / cfg.max_total_tokens:.2f}, cuda graph: True, "
                f"gen throughput (token/s): {self.stats.gen_throughput:.2f}, "
                f"#queue-req: {len(self.waiting)}"
            )
            self._window = _Window()

    def _emit(self, req: Req, k: int) -> int:
        """Up to k ids for one request; returns how many came out."""
        before = len(req.output_ids)
        if req.first_token_at is None:
            req.first_token_at = time.monotonic()
        for _ in range(k):
            if req.fault is not None and len(req.output_ids) >= req.fault_at:
                # An injected fault strikes here: the server aborts the request, the connection
                # drops (the front end then closes it and the request is aborted), or the model
                # samples an id outside the vocabulary.
                if req.fault == "nan":
                    req.nan()
                    break
                req.dropped = req.fault == "drop"
                req.finish = finish_abort(req.fault_message)
                break
            req.step()
            if req.finish is not None:
                break
        made = len(req.output_ids) - before
        self.kv_used += made
        req.event.set()
        return made

    def _settle(self, produced: int) -> None:
        """After a forward: finished requests leave the batch and free their tokens."""
        if produced:
            self.last_output_at = time.monotonic()
            self.output_event.set()
            self.output_event = asyncio.Event()
        done = [r for r in self.running if r.finish is not None]
        if done:
            self.running = [r for r in self.running if r.finish is None]
            for req in done:
                self._end(req)

    def _retract(self, cfg: SimSGLangConfig, k: int) -> None:
        old = self.new_token_ratio
        retracted: list[Req] = []
        while len(self.running) > 1 and self.kv_used + len(self.running) * k > cfg.max_total_tokens:
            victim = min(self.running, key=lambda r: (len(r.output_ids), -r.n_prompt))
            self.running.remove(victim)
            self.kv_used -= victim.kv_tokens
            victim.status = "waiting"
            victim.num_retractions += 1
            retracted.append(victim)
        for req in reversed(retracted):
            self.waiting.appendleft(req)
        if self.running and self.kv_used + len(self.running) * k > cfg.max_total_tokens:
            # One request alone outgrows the pool: it ends rather than crash the server.
            last = self.running.pop()
            self.log.scheduler("Decode out of memory. Try to lower your batch size.", level="error")
            last.finish = finish_abort("The request was aborted because the KV cache pool is full.", 503)
            self._end(last)
        if retracted:
            decoded = sum(len(r.output_ids) for r in self.running)
            budget = sum(r.sampling.max_new_tokens for r in self.running) or 1
            self.new_token_ratio = min(1.0, (decoded + _RETRACT_DECODE_STEPS * len(self.running)) / budget)
            self.new_token_ratio = max(self.new_token_ratio, old)
            self.stats.retracted(len(retracted))
            self.log.scheduler(
                "KV cache pool is full. Retract requests. "
                f"#retracted_reqs: {len(retracted)}, "
                f"#new_token_ratio: {old:.4f} -> {self.new_token_ratio:.4f}",
                level="warning",
            )

    # --- the watchdog ------------------------------------------------------------------------------
    async def _watch(self) -> None:
        """SGLang's watchdog thread: a batch stuck in one forward for watchdog_timeout crashes the
        server on purpose rather than let it hang. With --soft-watchdog-timeout a second watchdog
        only logs the same line with `self.soft=True`, once per period stuck, and lets it run."""
        last_ct = self.forward_ct
        last_change = soft_mark = time.monotonic()
        while True:
            cfg = self._config()
            timeout = cfg.watchdog_timeout * cfg.time_scale
            soft = None if cfg.soft_watchdog_timeout is None else cfg.soft_watchdog_timeout * cfg.time_scale
            await asyncio.sleep(max(0.01, min(timeout / 2, soft / 2 if soft else 1.0, 1.0)))
            now = time.monotonic()
            if not self.in_forward or self.forward_ct != last_ct or self.paused:
                last_ct = self.forward_ct
                last_change = soft_mark = now
                continue
            if now - last_change > timeout:
                self._on_watchdog()
                return
            if soft is not None and now - soft_mark > soft:
                soft_mark = now
                self.log.scheduler(soft_watchdog_line(cfg.soft_watchdog_timeout or 0.0), level="error")


def soft_watchdog_line(timeout: float) -> str:
    """The soft watchdog's line: the hard one's words with `self.soft=True` (utils/watchdog.py)."""
    return f"Scheduler watchdog timeout (self.watchdog_timeout={timeout:g}, self.soft=True)"
