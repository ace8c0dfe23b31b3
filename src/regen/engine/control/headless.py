"""`--headless`: the job in the foreground, a status line every few seconds, a summary at the end.

SIGINT and SIGTERM drain gracefully (a second one cancels what is in flight; those prompts are
re-sent by the next run) and the process exits 130 or 143.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import signal
import sys
import time
from collections.abc import Callable
from typing import TextIO

from regen.engine.control.metrics import MetricsServer
from regen.engine.control.server import SOCKET_NAME, ControlServer
from regen.engine.durations import duration
from regen.engine.job.job import Job, Outcome, StopReason
from regen.engine.schema import (
    EventRecord,
    FleetView,
    LaneView,
    MoneyView,
    ProviderView,
    Snapshot,
    budget_lane,
)
from regen.engine.units import Unit, amount


def _count(n: float) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    if n >= 1e4:
        return f"{n / 1e3:.1f}k"
    return f"{n:.0f}" if n >= 100 or n == int(n) else f"{n:.1f}"


def money_line(money: MoneyView) -> str:
    """Spent, split into what was billed and what is still an estimate, and why."""
    unit = money["unit"]
    line = f"spent {amount(money['spent'], unit, 'exact')}"
    if money["budget"] is not None:
        line += f" of {amount(money['budget'], unit, 'plain')}"
    parts = []
    pending, unknowable = money["pending"], money["unknowable"]
    if pending["requests"]:
        parts.append(
            f"{amount(pending['amount'], unit, 'exact')} estimated for {pending['requests']} requests "
            "until their bill is looked up"
        )
    if unknowable["requests"] and money.get("unknowable_bound") == "key_usage":
        waited = money.get("unknowable_bound_wait_s")
        parts.append(
            f"{amount(unknowable['amount'], unit, 'exact')} for {unknowable['requests']} requests cut before their "
            "generation id arrived, bounded by what the key's usage grew by"
            + (
                f" (read once it had settled, after {waited:.1f} s)"
                if isinstance(waited, int | float)
                else ""
            )
        )
    elif unknowable["requests"]:
        parts.append(
            f"{amount(unknowable['amount'], unit, 'exact')} is the worst case of {unknowable['requests']} requests "
            "cut before their generation id arrived (no bill can ever name them, so it stays counted)"
        )
    if parts:
        line += f": {amount(money['confirmed'], unit, 'exact')} confirmed, " + "; ".join(parts)
    return line


def estimate_part(money: MoneyView) -> str:
    """The estimated part of spend, for the status line: bills coming (ids known) apart from
    worst cases no bill can name (docs/money.md); empty when nothing is estimated."""
    unit = money["unit"]
    pending, unknowable = money["pending"], money["unknowable"]
    parts = []
    if pending["requests"]:
        parts.append(f"{amount(pending['amount'], unit, 'plain')} pending for {pending['requests']} bills")
    if unknowable["requests"]:
        parts.append(f"{amount(unknowable['amount'], unit, 'plain')} unknowable")
    return f" ({', '.join(parts)})" if parts else ""


def status_line(snap: Snapshot) -> str:
    """One line: state, per-dataset progress, rates, in flight, the budget lane's money and limit
    (engine/schema.py budget_lane), errors by class, ETA; with several backends, each one's share."""
    datasets = " ".join(f"{d['name']} {d['done']}/{d['total']}" for d in snap["datasets"])
    rates = snap["rates"]
    paid = budget_lane(snap)
    money = paid["money"]
    conc = paid["concurrency"]
    limit = (
        f"{conc['effective']}"
        if conc["effective"] == conc["configured"]
        else f"{conc['effective']}<{conc['configured']}"
    )
    errors = " ".join(f"{k}:{v}" for k, v in sorted(snap["errors"].items())) or "none"
    unit = money["unit"]
    estimated = estimate_part(money)
    budget = "" if money["budget"] is None else f" / {amount(money['budget'], unit, 'plain')}"
    state = snap["state"]
    settling = sum(lane["money"]["settling"] or 0 for lane in snap["lanes"])
    if any(lane["money"]["settling"] is not None for lane in snap["lanes"]):
        state += f" (settling {settling} bills)"
    elif paid["outage_s"] is not None:
        state += f" (HELD: {paid['held_reason']} for {duration(paid['outage_s'], 'clock')})"
    elif paid["held_s"] is not None:
        state += f" (held {duration(paid['held_s'], 'clock')}: {paid['held_reason']})"
    lanes = snap["lanes"]
    # With several backends the limit is each one's, said in the split below: the job's total has none.
    flying = f"{snap['in_flight']}" if len(lanes) > 1 else f"{snap['in_flight']}/{limit}"
    line = (
        f"[{duration(snap['elapsed_s'], 'clock')}] {state} | {datasets} | "
        f"{_count(rates['output_tokens_per_s'])} tok/s {rates['attempts_per_s']:.1f} req/s | "
        f"in flight {flying} | "
        f"{amount(money['spent'], unit, 'plain')} spent{estimated} + {amount(money['reserved'], unit, 'plain')} reserved{budget} | "
        f"errors {errors} | ETA {duration(snap['eta_s'], 'clock')}"
    )
    if len(lanes) > 1:
        line += " | split " + " · ".join(lane_part(lane) for lane in lanes)
    fleet = snap.get("fleet")
    if fleet is not None:
        line += " | " + plan_part(fleet)
        if fleet["deadline_ts"] is not None:
            line += " | " + deadline_part(fleet)
    drifting = drifted(snap)
    if drifting:
        line += " | DRIFT " + ", ".join(p["name"] for _, p in drifting)
    return line


def drifted(snap: Snapshot) -> list[tuple[LaneView, ProviderView]]:
    """The routes whose fingerprint flagged them (engine/job/fidelity.py), lane by lane."""
    return [
        (lane, p)
        for lane in snap["lanes"]
        for p in lane["providers"]
        if (view := p.get("fidelity")) is not None and view["state"] == "drift"
    ]


def plan_part(fleet: FleetView) -> str:
    """The plan for the status line: what the GPUs make, what OpenRouter must carry and for how
    much, against the dollars left, and the verdict (docs/fleets.md, "In the job")."""
    plan = fleet["plan"]
    gpus = plan["gpu_tokens"] > 0 or plan["gpu_tokens_per_s"] > 0
    part = "plan " + (f"GPUs {_count(plan['gpu_tokens'])} tok, " if gpus else "")
    part += f"OpenRouter {_count(plan['openrouter_tokens'])} tok ${plan['cost']:.2f}"
    if plan["budget_left"] is not None:
        part += f" (budget left ${plan['budget_left']:.2f})"
    # In the job's words (engine/money/fleetplan/pacing.py `verdict_words`): never "fits" beside a cost
    # over the budget left or an ETA past the deadline (docs/fleets.md, "The verdict").
    return f"{part}: {fleet['verdict']}"


def _at(ts: float) -> str:
    """A wall-clock instant in local time; the day too when it is not today."""
    when = dt.datetime.fromtimestamp(ts).astimezone()
    return f"{when:%H:%M:%S}" if when.date() == dt.date.today() else f"{when:%a %H:%M:%S}"


def deadline_part(fleet: FleetView) -> str:
    """The deadline, the ETA at the pace measured now against it, and whether the plan fits."""
    left, at = fleet["time_left_s"], fleet["deadline_ts"]
    assert at is not None, "a deadline part is asked only of a fleet with a deadline"
    part = f"deadline {_at(at)}"
    if left is not None and left < 0:
        return part + f" passed {duration(-left, 'clock')} ago"
    part += f" in {duration(left, 'clock')}"
    eta = fleet["eta_s"]
    if eta is not None and left is not None:
        verdict = "on time" if eta <= left else f"{duration(eta - left, 'clock')} late"
        part += f", ETA {duration(eta, 'clock')} ({verdict})"
    return part + ("" if fleet["fits"] else ", CANNOT BE MET")


def plan_line(fleet: FleetView) -> str:
    """The plan over the fleets, said before the start and when it stops (or starts again) fitting."""
    at = fleet["deadline_ts"]
    if at is None:
        return f"plan: {fleet['plan']['reason']}"
    left = fleet["time_left_s"]
    said = f"deadline {_at(at)} (in {duration(max(0.0, left or 0.0), 'clock')}): {fleet['plan']['reason']}"
    # Paced, the pacer's line follows: what OpenRouter's ceiling is and why.
    return (
        f"{said}; {fleet['reason']}"
        if fleet["steered"] and fleet["reason"] != fleet["plan"]["reason"]
        else said
    )


# Events the status lines do not show and an operator reading the log should see when they happen.
_SAID = {
    "deadline_unreachable": lambda e: f"deadline: cannot be met now: {e.get('detail') or e.get('reason')}",
    "deadline_reachable": lambda e: f"deadline: within reach again: {e.get('reason')}",
    "deadline": lambda e: (
        "deadline cleared" if e.get("at") is None else f"deadline set to {_at(e['at'])} ({e.get('source')})"
    ),
    "lane_closed": lambda e: f"{e.get('backend')}: closed: {e.get('reason')}",
    # A stalled fleet and the work taken back from it (docs/fleets.md, "A stalled fleet").
    "stall": lambda e: f"{e.get('backend')}: {e.get('reason')}",
    "taken_back": lambda e: f"{e.get('backend')}: {e.get('prompts')} prompts taken back and queued again",
    "stall_end": lambda e: (
        f"{e.get('backend')}: answering again"
        + (" (an abort's answer: one request at a time until one is answered)" if e.get("probation") else "")
    ),
    "probation_end": lambda e: f"{e.get('backend')}: a request answered, sending at full rate again",
    "drift": lambda e: f"DRIFT {e.get('provider')} ({e.get('action')}): {e.get('evidence')}",
}


def event_lines(events: list[EventRecord]) -> list[str]:
    return [_SAID[e["event"]](e) for e in events if e["event"] in _SAID]


def _lane_limit(lane: LaneView) -> str:
    conc = lane["concurrency"]
    limit = conc["effective"]
    ceiling = lane["ceiling"]
    if ceiling is not None:
        limit = min(limit, ceiling)
    return f"{limit}" if limit == conc["configured"] else f"{limit}<{conc['configured']}"


def lane_part(lane: LaneView) -> str:
    """One backend's share for the status line: rows, tokens, money in its unit, in flight."""
    money = lane["money"]
    state = "" if lane["state"] == "running" else f" {lane['state'].upper()}"
    return (
        f"{lane['name']}{state} {lane['rows']} rows ({lane['rows_share'] * 100:.0f}%) "
        f"{_count(lane['output_tokens'])} tok {amount(money['spent'], money['unit'], 'exact')} "
        f"in flight {lane['in_flight']}/{_lane_limit(lane)}"
    )


def lane_line(lane: LaneView) -> str:
    """One backend's share for the summary."""
    money = lane["money"]
    unit = money["unit"]
    spent = amount(money["spent"], unit, "exact")
    if money["budget"] is not None:
        spent += f" of {amount(money['budget'], unit, 'plain')}"
    errors = sum(lane["errors"].values())
    closed = f"; closed: {lane['reason']}" if lane["state"] == "closed" else ""
    return (
        f"  {lane['name']}: {lane['rows']} rows ({lane['rows_share'] * 100:.1f}%), "
        f"{lane['output_tokens']} output tokens, {spent}, {lane['attempts']} attempts, errors {errors}{closed}"
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def _millis(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}ms"


def provider_line(p: ProviderView, unit: Unit) -> str:
    errors = sum(p["errors"].values())
    per_m = "-" if p["cost_per_m_output"] is None else f"{amount(p['cost_per_m_output'], unit, 'plain')}/M"
    return (
        f"  {p['status']:<4} {p['name']}: {p['requests']} requests ({p['share'] * 100:.0f}%), {p['ok']} rows, "
        f"latency p50 {_seconds(p['latency_p50_s'])} p95 {_seconds(p['latency_p95_s'])}, "
        f"TTFT p50 {_seconds(p['ttft_p50_s'])}, TPOT {_millis(p['tpot_s'])}, "
        f"{_count(p['output_tokens_per_s'])} tok/s, {amount(p['spent'], unit, 'exact')} ({per_m}), "
        f"errors {errors} (429s {p['throttled']})"
    )


def summary_lines(snap: Snapshot, outcome: Outcome) -> list[str]:
    lines = ["", "summary:"]
    for d in snap["datasets"]:
        lines.append(
            f"  {d['name']}: {d['done']}/{d['total']} rows ({d['ok']} ok, {d['truncated']} truncated, "
            f"{d['failed']} failed, {d['invalid']} invalid skipped), {d['output_tokens']} output tokens, {d['state']}"
        )
    paid = budget_lane(snap)
    money = paid["money"]
    unit = money["unit"]
    lanes = snap["lanes"]
    if len(lanes) > 1:
        lines.append("backends:")
        lines.extend(lane_line(lane) for lane in lanes)
        for lane in lanes:
            lines.append(f"providers ({lane['name']}):")
            lane_unit = lane["money"]["unit"]
            lines.extend(
                provider_line(p, lane_unit) for p in lane["providers"] if p["requests"] or p["allowed"]
            )
    else:
        lines.append("providers:")
        # Routes that never served and are kept out are listed by the console, not here.
        lines.extend(provider_line(p, unit) for p in paid["providers"] if p["requests"] or p["allowed"])
    lines.append(f"money: {money_line(money)}")
    per_m = money["useful_per_m"]
    lines.append(
        f"  useful {amount(money['useful'], unit, 'exact')} for {money['useful_output_tokens']} output tokens"
        + (f" ({amount(per_m, unit, 'plain')}/M)" if per_m is not None else "")
    )
    waste = ", ".join(
        f"{cause} {amount(w['amount'], unit, 'exact')}"
        for cause, w in money["waste"].items()
        if w["amount"] or w["tokens"]
    )
    lines.append(f"  waste {amount(money['waste_total'], unit, 'exact')}" + (f": {waste}" if waste else ""))
    fleet = snap.get("fleet")
    at = None if fleet is None else fleet["deadline_ts"]
    if at is not None:
        early = at - time.time()
        verdict = (
            f"{duration(early, 'clock')} before it"
            if early >= 0
            else f"missed by {duration(-early, 'clock')}"
        )
        lines.append(f"deadline {_at(at)}: ended {verdict}")
    if snap["quarantined"]:
        lines.append(f"  quarantined responses: {snap['quarantined']} (see quarantine.jsonl)")
    for _, p in drifted(snap):
        view = p.get("fidelity")
        assert view is not None
        lines.append(
            f"  DRIFT {p['name']} ({view['action'] or 'warn'}): {view['evidence']} (docs/fidelity.md)"
        )
    lines.append(f"{'done' if outcome.reason is StopReason.DONE else 'stopped'}: {outcome.message}")
    return lines


async def run_headless(
    job: Job,
    *,
    out: TextIO = sys.stdout,
    interval_s: float | None = None,
    on_ready: Callable[[Job], None] | None = None,
) -> Outcome:
    """Run a job to its end, printing status lines, with SIGINT/SIGTERM handlers; prepare() it
    first if that is not done. Under the handlers: a signal while the job starts (a scan, a resume
    over a long journal) stops it as soon as the start is done, before anything is sent (left to
    asyncio's own handler, that signal was lost and the job ran on). prepare()'s JobError is raised."""
    interval = job.settings.headless.status_interval_s if interval_s is None else interval_s
    loop = asyncio.get_running_loop()
    installed = _install_signals(loop, job, out)
    try:
        if not job.prepared:
            await job.prepare()
    except BaseException:
        for signum in installed:
            loop.remove_signal_handler(signum)
        raise
    control = await _open_control(job, out)
    metrics = await open_metrics(job, out)
    if on_ready is not None:
        on_ready(job)
    first = job.snapshot()
    if "fleet" in first:
        _say(out, plan_line(first["fleet"]))
    # The events of prepare() (the plan before the start among them) are said above, not again.
    cursor, _ = job.events_since(0)
    runner = asyncio.ensure_future(job.run())
    try:
        outcome = await _follow(job, runner, cursor, interval, out)
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
        if control is not None:
            await control.push_now()
            await control.close()
        if metrics is not None:
            await metrics.close()
    _say(out, status_line(job.snapshot()))
    for line in summary_lines(job.snapshot(), outcome):
        _say(out, line)
    return outcome


def _say(out: TextIO, line: str) -> None:
    print(line, file=out, flush=True)


def _install_signals(loop: asyncio.AbstractEventLoop, job: Job, out: TextIO) -> list[int]:
    """SIGINT and SIGTERM stop the job: the first drains the requests in flight, a second cancels
    them. Returns the signals whose handlers were installed (none where the loop cannot)."""
    seen: list[int] = []

    def on_signal(signum: int) -> None:
        seen.append(signum)
        reason = StopReason.SIGINT if signum == signal.SIGINT else StopReason.SIGTERM
        name = signal.Signals(signum).name
        if len(seen) == 1:
            if job.prepared:
                in_flight = job.snapshot()["in_flight"]
                _say(out, f"{name}: draining {in_flight} requests in flight (again to cancel them)")
            else:
                _say(out, f"{name}: stopping as soon as the job has started; nothing will be sent")
            job.stop(reason=reason, message=f"interrupted by {name}; in-flight requests drained")
        else:
            _say(out, f"{name}: cancelling requests in flight; they are re-sent on the next run")
            job.stop(cancel=True, reason=reason)

    installed: list[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(signum, on_signal, signum)
            installed.append(signum)
        except (NotImplementedError, RuntimeError):
            pass
    return installed


async def _open_control(job: Job, out: TextIO) -> ControlServer | None:
    """The control socket consoles attach to; None, said once, when it cannot be made (the job
    runs on without consoles)."""
    server = ControlServer(
        job.run_dir / SOCKET_NAME,
        snapshot=job.snapshot,
        events_since=job.events_since,
        job_info=job.info(),
        handle=job.handle_command,
    )
    try:
        await server.start()
    except OSError as exc:
        _say(out, f"regen: warning: no control socket at {server.path} ({exc}); consoles cannot attach")
        return None
    return server


async def open_metrics(job: Job, out: TextIO) -> MetricsServer | None:
    """/metrics when `[metrics] listen` is set (docs/metrics.md); None when it is not, and, said once,
    when the address cannot be listened on (the job runs on without it, as without a control socket)."""
    address = job.settings.metrics.address
    if address is None:
        return None
    server = MetricsServer(job, *address)
    try:
        await server.start()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        _say(
            out,
            f"regen: warning: metrics.listen: cannot listen on {server.address} ({reason}); no /metrics this run",
        )
        return None
    _say(out, f"metrics: http://{server.address}/metrics")
    return server


async def _follow(
    job: Job, runner: asyncio.Future[Outcome], cursor: int, interval: float, out: TextIO
) -> Outcome:
    """The job's events as they happen and a status line every `interval`, until it ends."""
    while not runner.done():
        done, _ = await asyncio.wait({runner}, timeout=interval)
        cursor, news = job.events_since(cursor)
        for said in event_lines(news):
            _say(out, said)
        if not done:
            _say(out, status_line(job.snapshot()))
    return runner.result()
