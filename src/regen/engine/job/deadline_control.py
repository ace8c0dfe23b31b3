"""The deadline control in the job: measures the lanes, feeds engine/money/fleetplan's `Pacer`, and
answers the dispatcher's ceiling hook (engine/job/lanes.py `LaneCeilings`) for OpenRouter's lane.

The rules it follows are in docs/fleets.md ("Pacing" and "In the job"): the deadline's instant is
resolved once and journaled (a restart keeps it), the plan is made before the start from the settings'
rates and re-made every `steering.interval_s` (the `[steering]` section keeps its name on disk) from
measured ones, OpenRouter's share is paced only in a job with a GPU lane, a dollar lane and a
deadline, and a plan that stops fitting is said at once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from regen.engine.config.settings import Settings
from regen.engine.durations import duration
from regen.engine.job.dispatch import Dispatcher
from regen.engine.job.lanes import Lane
from regen.engine.job.overdue import MEASURED_ROWS, gpu_hold, over, shares
from regen.engine.job.stall import stalled
from regen.engine.money.deadline import parse_deadline, resolve_deadline
from regen.engine.money.fleetplan.pacing import Facts, PaceDecision, Pacer, verdict_words
from regen.engine.money.fleetplan.plan import RouteOffer, Work, by_price
from regen.engine.money.planner import DatasetNeed, remaining_output_tokens
from regen.engine.run.events import EventLog
from regen.engine.run.records import DeadlineEvent, deadline_event
from regen.engine.run.state import DatasetState, JobError
from regen.engine.schema import FleetView
from regen.engine.units import DOLLARS  # the unit of the lane whose share is bought (OpenRouter's)

MIN_SPAN_S = 1.0  # a rate measured over less is noise (requests land in bursts)


def remaining_needs(datasets: Mapping[str, DatasetState], expected_output_tokens: int) -> list[DatasetNeed]:
    """The work left per dataset: prompts not yet made (in flight included), the output tokens they
    should need at the mean measured so far (the setting before any row), the prompt tokens billed."""
    needs = []
    for name, state in datasets.items():
        done = state.done
        per_prompt = state.progress.output_tokens / done if done else float(expected_output_tokens)
        remaining = max(0, state.remaining)
        output = remaining_output_tokens(
            remaining, per_prompt, state.progress.output_tokens, state.token_budget
        )
        needs.append(DatasetNeed(name, remaining, output, int(remaining * state.prompt_tokens_mean)))
    return needs


@dataclass(slots=True)
class _Mark:
    """A lane's totals at the last tick: what the next tick's rates are measured from."""

    at: float  # monotonic
    tokens: int
    busy_s: float


class DeadlineControl:
    """OpenRouter's in-flight ceiling from the GPUs' measured pace and the deadline; the live plan."""

    def __init__(
        self,
        settings: Settings,
        dispatcher: Dispatcher,
        datasets: Mapping[str, DatasetState],
        events: EventLog,
    ) -> None:
        self.settings = settings
        self.dispatcher = dispatcher
        self.datasets = datasets
        self.events = events
        lanes = dispatcher.lanes
        self.paid: Lane | None = next((lane for lane in lanes if lane.ledger.unit == DOLLARS), None)
        self.gpus: list[Lane] = [lane for lane in lanes if lane.ledger.unit != DOLLARS]
        tuning = settings.steering
        self.interval_s = tuning.interval_s
        self.pacer = Pacer(
            self.paid.limit.configured if self.paid is not None else 0,
            # A GPU rate only with GPUs to make it: a job without a GPU lane plans OpenRouter alone.
            gpu_tokens_per_s=tuning.gpu_tokens_per_s if self.gpus else None,
            request_tokens_per_s=tuning.request_tokens_per_s,
            smoothing_s=tuning.smoothing_s,
            margin=tuning.margin,
            deadband=tuning.deadband,
        )
        self.deadline_text: str | None = None
        self.deadline_ts: float | None = None
        self.last: PaceDecision | None = None
        self._fits: bool | None = None
        self._marks: dict[str, _Mark] = {}
        self._openrouter_rate = 0.0
        # The GPU lanes' bound in the end game (engine/job/overdue.py): lane name -> most in flight.
        self._gpu_ceilings: dict[str, int] = {}

    # ----------------------------------------------------------------------------- the deadline

    @property
    def shown(self) -> bool:
        """Whether the snapshot carries the fleet view: several lanes or a deadline."""
        return len(self.dispatcher.lanes) > 1 or self.deadline_ts is not None

    @property
    def paced(self) -> bool:
        """Whether OpenRouter's share follows the deadline: GPUs to lean on, dollars to save, a deadline."""
        return self.paid is not None and bool(self.gpus) and self.deadline_ts is not None

    def restore(self, journaled: DeadlineEvent | None, first_start: float | None) -> None:
        """The deadline at this start (docs/fleets.md, "In the job"): the journaled instant while the
        setting is what it was when journaled, else the setting resolved from the run's first start."""
        setting = self.settings.job.deadline
        if journaled is not None and journaled.get("setting") == setting:
            at = journaled.get("at")
            self.deadline_text = journaled.get("text") if at is not None else None
            self.deadline_ts = float(at) if at is not None else None
            return
        if setting is None and journaled is None:
            return
        start = dt.datetime.fromtimestamp(
            first_start if first_start is not None else time.time()
        ).astimezone()
        self._set(
            setting, None if setting is None else resolve_deadline(parse_deadline(setting), start), "settings"
        )

    def set_deadline(self, text: str | None, origin: str) -> str:
        """A deadline typed by the operator: a duration from now, or a time of day's next occurrence."""
        if text is None:
            if self.deadline_ts is None:
                return "no deadline is set"
            self._set(None, None, origin)
            self.tick()
            return "deadline cleared: both fleets flat out, GPUs first"
        try:
            deadline = parse_deadline(text)
        except ValueError as exc:
            raise JobError(str(exc)) from None
        at = resolve_deadline(deadline, dt.datetime.now().astimezone())
        self._set(text.strip(), at, origin)
        decision = self.tick()
        return f"deadline {at:%a %H:%M:%S} ({duration(max(0.0, at.timestamp() - time.time()), 'fine')} from now): {decision.reason}"

    def _set(self, text: str | None, at: dt.datetime | None, source: str) -> None:
        self.deadline_text = text
        self.deadline_ts = None if at is None else at.timestamp()
        self.events.write(
            deadline_event(
                text,
                self.deadline_ts,
                None if at is None else at.isoformat(timespec="seconds"),
                self.settings.job.deadline,
                source,
                time.time(),
            )
        )
        self._fits = None  # a new deadline is judged afresh
        self.pacer.verdict = None

    # --------------------------------------------------------------------------- the ceiling hook

    def lane_ceiling(self, lane: str) -> int | None:
        paid = self.paid
        if paid is None or not self.paced:
            return None
        if lane != paid.name:
            return self._gpu_ceilings.get(lane)
        return self.pacer.ceiling

    # -------------------------------------------------------------------------------- measuring

    def _measure(self, lanes: list[Lane], now: float) -> tuple[float | None, float | None]:
        """Output tokens/s of `lanes` since the last tick (None before any token or any span), and
        tokens per in-flight second over it: one request's rate, what a ceiling multiplies."""
        tokens = span = busy = 0.0
        measured = False
        for lane in lanes:
            made, flown = lane.stats.counters.output_tokens, lane.busy_s(now)
            mark = self._marks.get(lane.name)
            if mark is not None and now - mark.at < MIN_SPAN_S:
                continue  # too short to measure: the next tick measures from the older mark
            self._marks[lane.name] = _Mark(now, made, flown)
            if mark is None or mark.tokens == 0:
                # Measured from the first tokens on: the ramp before them (the first prefills, a start
                # on a busy machine) is not the fleet's pace, and one early sample weighs a lot.
                continue
            span = max(span, now - mark.at)
            tokens += made - mark.tokens
            busy += flown - mark.busy_s
            measured = measured or made > 0
        if not measured or span <= 0:
            return None, None
        return tokens / span, (tokens / busy if busy > 0 else None)

    def offers(self, work: Work, request_rate: float) -> tuple[RouteOffer, ...]:
        """OpenRouter's allowed providers with the tokens/s each sustains: the lane's flat-out rate
        (its concurrency x one request's rate) shared as OpenRouter has shared the requests so far;
        before any, all on the cheapest, where price-sorted routing sends them."""
        paid = self.paid
        routes = None if paid is None or paid.closed is not None else paid.backend.routes
        if paid is None or routes is None:
            return ()
        prices = routes.prices()
        if not prices:
            return ()
        flat_out = paid.limit.configured * request_rate
        route_id = routes.route_id
        served: dict[str, int] = {}
        for name, stats in paid.stats.routes.items():
            served[route_id(name)] = served.get(route_id(name), 0) + stats.requests
        counts = [served.get(route_id(price.route), 0) for price in prices]
        total = sum(counts)
        if total == 0:
            cheapest = by_price(work, [RouteOffer(price) for price in prices])[0].price.route
            counts = [1 if price.route == cheapest else 0 for price in prices]
            total = 1
        return tuple(
            RouteOffer(price, flat_out * count / total) for price, count in zip(prices, counts, strict=True)
        )

    def _stalls(self, work: Work, now_mono: float) -> bool:
        """Whether the GPU fleet is stalled (engine/job/stall.py): a lane silent past its expected
        answer time is stalled now, and what it holds taken back; True while every open GPU lane is."""
        open_lanes = [lane for lane in self.gpus if lane.closed is None]
        if not open_lanes:
            return False
        # Before any answer, one answer's expected time: the work's tokens per prompt at a request's
        # expected rate (the settings'), what the plan before the start assumes too.
        per_prompt = work.output_tokens / work.prompts if work.prompts else 0.0
        before_any = per_prompt / self.settings.steering.request_tokens_per_s
        for lane in open_lanes:
            if lane.stalled is None:
                reason = stalled(lane, now_mono, self.interval_s, before_any)
                if reason is not None:
                    self.dispatcher.stall(lane, reason)
        return all(lane.stalled is not None for lane in open_lanes)

    def facts(self, now_mono: float | None = None) -> Facts:
        now_mono = time.monotonic() if now_mono is None else now_mono
        work = Work.of(remaining_needs(self.datasets, self.settings.expected_output_tokens))
        gpu_rate, _ = self._measure(self.gpus, now_mono)
        # Silence is evidence (docs/fleets.md, "A stalled fleet"): a stalled fleet makes nothing.
        gpu_stalled = self._stalls(work, now_mono)
        if gpu_stalled:
            gpu_rate = 0.0
        paid = self.paid
        request_rate: float | None = None
        in_flight = 0
        budget_left: Decimal | None = None
        if paid is not None:
            rate, request_rate = self._measure([paid], now_mono)
            if rate is not None:
                self._openrouter_rate = rate
            in_flight = paid.in_flight
            budget_left = paid.ledger.left
            self.pacer.max_in_flight = paid.limit.configured
        return Facts(
            now=time.time(),
            work_left=work,
            gpu_tokens_per_s=gpu_rate,
            request_tokens_per_s=request_rate,
            in_flight=in_flight,
            budget_left=budget_left,
            deadline=self.deadline_ts,
            offers=self.offers(work, request_rate or self.pacer.request_tokens_per_s),
            rows=sum(state.done for state in self.datasets.values()),
            gpu_rows=self._gpu_rows(),
            gpu_stalled=gpu_stalled,
        )

    def _gpu_rows(self) -> int | None:
        """The rows the GPU lanes made in this run: the evidence of their rate; None without a GPU
        lane still open (no rows will come to wait for)."""
        open_lanes = [lane for lane in self.gpus if lane.closed is None]
        return sum(lane.stats.counters.rows for lane in open_lanes) if open_lanes else None

    # ----------------------------------------------------------------------------------- pacing

    def tick(self, now_mono: float | None = None) -> PaceDecision:
        """Re-plan from what was measured since the last tick; journal what changed."""
        before = self.pacer.ceiling
        facts = self.facts(now_mono)
        decision = self.pacer.update(facts)
        self.last = decision
        self._end_game(facts, decision)
        if self.paced and decision.ceiling != before:
            # `steer`: the event's name on disk since before the pacer had its own (docs/fleets.md).
            self.events.event("steer", ceiling=decision.ceiling, reason=decision.reason)
            if before is not None and (decision.ceiling is None or decision.ceiling > before):
                self.dispatcher.wake()
        self._judge(decision)
        return decision

    def _end_game(self, facts: Facts, decision: PaceDecision) -> None:
        """Near the deadline, the GPU lanes hold only what they finish by it, the rest taken back for
        OpenRouter (engine/job/overdue.py): once their rate is measured (a rate from the settings is
        a guess, and a bound from a guess would starve the GPUs), while OpenRouter can take work."""
        paid = self.paid
        lanes = [lane for lane in self.gpus if lane.closed is None and lane.stalled is None]
        work = facts.work_left
        hold = None
        if (
            self.paced
            and paid is not None
            and paid.closed is None
            and not paid.budget_blocked
            and lanes
            and (facts.gpu_rows or 0) >= MEASURED_ROWS
            and work.prompts > 0
        ):
            per_prompt = work.output_tokens / work.prompts
            hold = gpu_hold(decision.plan, per_prompt, per_prompt / self.pacer.request_tokens_per_s)
        before = dict(self._gpu_ceilings)
        if hold is None:
            self._gpu_ceilings.clear()
        else:
            bounds = shares(hold, [lane.in_flight for lane in lanes])
            self._gpu_ceilings = {lane.name: bound for lane, bound in zip(lanes, bounds, strict=True)}
            for lane, bound in zip(lanes, bounds, strict=True):
                excess = over(lane.in_flight, bound)
                if excess:
                    self.dispatcher.take_back(
                        lane,
                        f"past the deadline: {lane.backend.title} finishes about {bound} of the "
                        f"{lane.in_flight} it holds by then",
                        excess,
                    )
        if any(self._gpu_ceilings.get(name, math.inf) > bound for name, bound in before.items()):
            self.dispatcher.wake()  # a bound rose or was lifted: room again

    def _judge(self, decision: PaceDecision) -> None:
        """Say once when the deadline stops (or starts again) being within reach."""
        if self.deadline_ts is None:
            self._fits = None
            return
        fits = decision.fits  # the verdict, changed only on evidence (docs/fleets.md, "The verdict")
        if fits == self._fits:
            return
        if not fits:
            self.events.event("deadline_unreachable", reason=decision.plan.reason, detail=decision.reason)
        elif self._fits is not None:
            self.events.event("deadline_reachable", reason=decision.plan.reason)
        self._fits = fits

    async def run(self) -> None:
        """Tick every `steering.interval_s` while the job runs (cancelled with the job's tasks)."""
        while True:
            await asyncio.sleep(self.interval_s)
            self.tick()

    # ------------------------------------------------------------------------------------- view

    def view(self) -> FleetView:
        decision = self.last if self.last is not None else self.tick()
        plan = decision.plan
        now = time.time()
        left = None if self.deadline_ts is None else self.deadline_ts - now
        work = plan.output_tokens
        pace = self.pacer.gpu_tokens_per_s + self._openrouter_rate if self._marks else 0.0
        paid = self.paid
        projected = None if paid is None else float(paid.ledger.spent + plan.cost)
        eta = work / pace if pace > 0 else (0.0 if work <= 0 else None)
        return {
            "deadline": self.deadline_text,
            "deadline_ts": self.deadline_ts,
            "time_left_s": left,
            "steered": self.paced,
            "ceiling": self.lane_ceiling(paid.name) if paid is not None else None,
            "reason": decision.reason if self.paced else plan.reason,
            "plan": plan.to_dict(),
            "fits": decision.fits,
            "verdict": verdict_words(decision.fits, plan, eta, left),
            "eta_s": eta,
            "gpu_tokens_per_s": self.pacer.gpu_tokens_per_s,
            "openrouter_tokens_per_s": self._openrouter_rate,
            "request_tokens_per_s": self.pacer.request_tokens_per_s,
            "aim_tokens_per_s": decision.openrouter_tokens_per_s,
            "projected_usd": projected,
        }
