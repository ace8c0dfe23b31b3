"""The header strip: job state, progress, money, burn rate and how fresh the numbers are."""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.content import Content
from textual.markup import escape
from textual.widgets import Static

from regen.console import format as fmt
from regen.engine.schema import Hello, MoneyView, Snapshot, budget_lane
from regen.engine.units import DOLLARS

STATE_LOOK = {
    "STARTING": ("…", "$text-muted"),
    "RUNNING": ("▶", "$success"),
    "PAUSED": ("‖", "$warning"),
    "DRAINING": ("↓", "$warning"),
    "STOPPED": ("■", "$error"),
    "DONE": ("✓", "$primary"),
}


@dataclass(slots=True)
class Freshness:
    """How old the numbers on screen are, and why they may not move."""

    age_s: float | None
    stale_after_s: float
    frozen: bool = False
    readonly: bool = False
    disconnected: str | None = None


def completion(snap: Snapshot) -> float | None:
    """Fraction of all datasets' prompts done."""
    datasets = snap["datasets"]
    total = sum(d["total"] for d in datasets)
    done = sum(d["done"] for d in datasets)
    return done / total if total else None


def budget_used(money: MoneyView) -> float | None:
    """(spent + reserved) / budget."""
    budget = money["budget"]
    if not budget:
        return None
    return (money["spent"] + money["reserved"]) / budget


class StatusStrip(Static):
    """Two lines at the top; every value carries a word, never a colour alone."""

    DEFAULT_CSS = """
    StatusStrip {
        height: 2;
        padding: 0 1;
        background: $surface;
        color: $foreground;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("connecting to the job…", id=id, markup=False)
        self.snapshot: Snapshot | None = None
        self.hello: Hello | None = None
        self.budget_warn_fraction = 0.8
        self.freshness = Freshness(None, 5.0)
        self._markup_shown = ""

    def show(self, snap: Snapshot | None, freshness: Freshness) -> None:
        """Repaint from a snapshot (or the last one, for a freshness tick)."""
        if snap is not None:
            self.snapshot = snap
        self.freshness = freshness
        markup = self._markup(freshness)
        if markup != self._markup_shown:
            self._markup_shown = markup
            # Two lines, full width: the size never changes, so no layout pass.
            self.update(Content.from_markup(markup), layout=False)

    def on_resize(self, event: events.Resize) -> None:
        self.show(None, self.freshness)

    def _markup(self, fresh: Freshness) -> str:
        snap = self.snapshot
        job = None if self.hello is None else self.hello["job"]
        if snap is None:
            first = (
                f"[$error]✗ NOT CONNECTED[/] {escape(fresh.disconnected)}"
                if fresh.disconnected
                else "connecting to the job…"
            )
            return first + "\n" + self._flags(fresh)
        state = snap["state"]
        glyph, colour = STATE_LOOK.get(state, ("?", "$text-muted"))
        # The lane holding the budget (engine/schema.py budget_lane): its money, limit and holds.
        lane = budget_lane(snap)
        money = lane["money"]
        done = completion(snap)
        used = budget_used(money)
        burn = money["burn_per_h"]
        spent, reserved, budget = money["spent"], money["reserved"], money["budget"]
        if money["blocked"]:
            money_colour, budget_word = "$budget-over", " BUDGET REACHED"
        elif used is not None and used >= self.budget_warn_fraction:
            money_colour, budget_word = "$budget-warn", " near budget"
        else:
            money_colour, budget_word = "$foreground", ""
        rates = snap["rates"]
        conc = lane["concurrency"]
        in_flight = f"{snap['in_flight']}/{conc['effective']}"
        if conc["configured"] != conc["effective"]:
            in_flight += f"<{conc['configured']}"
        if len(snap["lanes"]) > 1:
            # With several backends the limits are each one's (the fleets pane): the job's total has
            # none, and one lane's limit under all of them read "18/16", as if over it (as headless).
            in_flight = str(snap["in_flight"])
        model = escape(snap["model"] or (job["model"] if job is not None else "?"))
        elapsed, eta = snap["elapsed_s"], snap["eta_s"]
        state_text = f"[b {colour}]{glyph} {state}[/]"
        outage = lane["outage_s"]
        held = lane["held_s"]
        if outage is not None:
            state_text += f" [b $error]HELD: unreachable {fmt.short_duration(outage)}[/]"
        elif held is not None:
            # A platform rate limit: nothing is sent until it resets, though the job is running.
            state_text += f" [b $warning]HELD {fmt.short_duration(held)}[/]"
        tokens, requests = fmt.rate(rates["output_tokens_per_s"]), fmt.rate(rates["attempts_per_s"])
        unit = money["unit"]
        if unit == DOLLARS:
            spend = [
                f"[{money_colour}]{fmt.amount(spent, DOLLARS, 'cents')} spent + {fmt.amount(reserved, DOLLARS, 'cents')} reserved of {fmt.amount(budget, DOLLARS, 'cents')} "
                f"({fmt.percent(used)} used){budget_word}[/]  {fmt.amount(burn, DOLLARS, 'cents')}/h",
                f"[{money_colour}]{fmt.amount(spent, DOLLARS, 'cents')} + {fmt.amount(reserved, DOLLARS, 'cents')} rsv of {fmt.amount(budget, DOLLARS, 'cents')} "
                f"{fmt.percent(used)}{budget_word}[/] {fmt.amount(burn, DOLLARS, 'cents')}/h",
                f"[{money_colour}]{fmt.amount(spent, DOLLARS, 'cents')}+{fmt.amount(reserved, DOLLARS, 'cents')}/{fmt.amount(budget, DOLLARS, 'whole')} "
                f"{fmt.percent(used)}{budget_word}[/] {fmt.amount(burn, DOLLARS, 'whole')}/h",
            ]
        else:
            # A GPU-time ledger has no budget: what the GPUs have done, and how many are busy.
            spend = [
                f"{fmt.amount(spent, unit, 'cents')} used  {fmt.amount(burn, unit, 'cents')}/h",
                f"{fmt.amount(spent, unit, 'cents')} used {fmt.amount(burn, unit, 'cents')}/h",
                f"{fmt.amount(spent, unit, 'short')} {fmt.amount(burn, unit, 'short')}/h",
            ]
        firsts = [
            f"{state_text}  {fmt.clock(elapsed)} elapsed  {fmt.percent(done, 1)} done  ETA {fmt.clock(eta)}  │  "
            f"{spend[0]}  │  {self._age(fresh)}",
            f"{state_text} {fmt.clock(elapsed)}  {fmt.percent(done, 1)} done  ETA {fmt.clock(eta)} │ "
            f"{spend[1]} │ {self._age(fresh)}",
            f"{state_text} {fmt.clock(elapsed)} {fmt.percent(done)} ETA {fmt.short_duration(eta)} │ "
            f"{spend[2]} │ {self._age(fresh, short=True)}",
        ]
        where = " · ".join(
            part
            for part in (
                model,
                f"pid {job['pid']}" if job is not None else "",
                escape(job["run_dir"]) if job is not None else "",
            )
            if part
        )
        outcome = snap["outcome"]
        ended = (
            f" · {escape(outcome['message'])}"
            if state in ("STOPPED", "DONE") and outcome is not None and outcome["message"]
            else ""
        )
        flags = self._flags(fresh)
        lead = f"{flags} " if flags else ""
        if fresh.disconnected:
            # The figures above stay as they were last seen; the second line says why they no longer
            # move, in full, and what to do (engine/control/server.py and console/client.py word it).
            return f"{self._fit(firsts)}\n{lead}[$error]{escape(fresh.disconnected)}[/]"
        seconds = [
            f"{lead}{where} · in flight {in_flight} · {tokens} tok/s · {requests} req/s · "
            f"{fmt.count(snap['rows'])} rows{ended}",
            f"{lead}{model} · in flight {in_flight} · {tokens} tok/s · {requests} req/s{ended}",
            f"{lead}{model.split('/')[-1]} · fly {in_flight} · {tokens} tok/s {requests} req/s{ended}",
        ]
        return f"{self._fit(firsts)}\n{self._fit(seconds)}"

    def _fit(self, candidates: list[str]) -> str:
        """The first candidate that fits the strip's width (else the last, which is the shortest)."""
        width = self.content_size.width or 200
        for candidate in candidates:
            if Content.from_markup(candidate).cell_length <= width:
                return candidate
        return candidates[-1]

    @staticmethod
    def _flags(fresh: Freshness) -> str:
        flags = []
        if fresh.readonly:
            flags.append("[reverse $warning] READ-ONLY [/]")
        if fresh.frozen:
            flags.append("[reverse $accent] FROZEN [/]")
        return " ".join(flags)

    def _age(self, fresh: Freshness, *, short: bool = False) -> str:
        if fresh.disconnected:
            return "[b $error]✗ DISCONNECTED[/]"  # why: on the line below (`_markup`)
        if fresh.age_s is None:
            return "waiting for data"
        age = f"{fresh.age_s:.1f} s" if fresh.age_s < 60 else fmt.short_duration(fresh.age_s)
        text = f"{age} ago" if short else f"updated {age} ago"
        if fresh.age_s > fresh.stale_after_s:
            return f"[b $data-stale]{text} (stale)[/]"
        return text
