"""The cost pane: spent, reserved, headroom, a budget bar, burn rate, projection and waste, in the
ledger's unit (dollars, or GPU time for SGLang, which has no budget but servers to show). A job with
several backends adds one line per backend: its rows and their share, its spend in its own unit,
its requests in flight against its limit."""

from __future__ import annotations

from typing import Any

from textual import events
from textual.markup import escape

from regen.console import format as fmt
from regen.console.format import number
from regen.console.widgets.bars import segments
from regen.console.widgets.text import TextPane

# Below this many columns of content the pane prints five short lines instead of ten labelled ones.
COMPACT_BELOW = 40


class CostPane(TextPane):
    """Money, in words and numbers; the bar repeats what the percentages say."""

    DEFAULT_CSS = """
    CostPane {
        padding: 0 1;
        background: $surface;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "Cost"
        self.money: dict[str, Any] = {}
        self.credits: dict[str, Any] | None = None
        self.lanes: list[dict[str, Any]] = []
        self.budget_warn_fraction = 0.8

    def show(self, snap: dict[str, Any], burn_per_h: float | None = None) -> None:
        """Repaint from a snapshot (with the console's burn rate when the job sends none)."""
        self.money = dict(snap.get("money") or {})
        if burn_per_h is not None:
            self.money["burn_per_h"] = burn_per_h
        account = (snap.get("backend") or {}).get("account")
        self.credits = account if isinstance(account, dict) else None
        lanes = snap.get("lanes")
        self.lanes = [lane for lane in lanes if isinstance(lane, dict)] if isinstance(lanes, list) else []
        self._paint()

    def on_resize(self, event: events.Resize) -> None:
        self._paint()

    def _paint(self) -> None:
        self.show_lines(self._lines() if self.money else ["waiting for data"])

    def _lines(self) -> list[str]:
        money = self.money
        unit = str(money.get("unit") or "usd")

        def amount(value: float | None) -> str:
            return fmt.amount(value, unit)

        spent = number(money.get("spent")) or 0.0
        reserved = number(money.get("reserved")) or 0.0
        estimated = number(money.get("estimated")) or 0.0
        budget = number(money.get("budget"))
        headroom = None if budget is None else budget - spent - reserved
        used = (spent + reserved) / budget if budget else None
        if budget is None and unit != "usd":
            bar_colour, verdict = "$primary", "none: GPU time is counted, not capped"
        elif money.get("blocked"):
            bar_colour, verdict = "$budget-over", "[b $budget-over]budget reached: no new requests[/]"
        elif used is not None and used >= self.budget_warn_fraction:
            bar_colour, verdict = "$budget-warn", f"[b $budget-warn]{fmt.percent(used)} used: near budget[/]"
        else:
            bar_colour, verdict = "$primary", f"{fmt.percent(used)} used"
        width = max(10, self.content_size.width or 30)
        bar = segments(
            [
                ((spent / budget) if budget else 0.0, bar_colour, "█"),
                ((reserved / budget) if budget else 0.0, "$secondary", "▒"),
            ],
            width,
        )
        burn = number(money.get("burn_per_h"))
        projected = number(money.get("projected_total"))
        projection = f"{amount(projected):>10}"
        if projected is not None and budget is not None:
            projection += (
                f" [b $budget-warn]over by {amount(projected - budget)}[/]"
                if projected > budget
                else " fits"
            )
        waste = money.get("waste") if isinstance(money.get("waste"), dict) else None
        waste_total = (
            None if waste is None else sum(number((w or {}).get("amount")) or 0.0 for w in waste.values())
        )
        waste_causes = (
            ""
            if not waste
            else " ("
            + ", ".join(
                f"{escape(str(cause))} {amount(number((w or {}).get('amount')))}"
                for cause, w in waste.items()
                if number((w or {}).get("amount")) or number((w or {}).get("tokens"))
            )
            + ")"
        )
        estimate = f" (~{amount(estimated)} est.)" if estimated > 0.005 else ""
        estimates = estimate_words(money)
        credits_left = None if self.credits is None else number(self.credits.get("limit_remaining"))
        last = (
            f"Credits    {amount(credits_left):>10} left"
            if unit == "usd"
            else f"Servers    {servers_line(self.credits)}"
        )
        if width < COMPACT_BELOW:
            return [
                f"{amount(spent)} spent + {amount(reserved)} rsv{estimate}",
                bar,
                f"{verdict} of {amount(budget)}",
                f"headroom {amount(headroom)} · {amount(burn)}/h",
                f"projected {projection.strip()}",
            ]
        lines = [
            f"Spent      {amount(spent):>10}"
            + (f"  {amount(number(money.get('confirmed')))} billed" if estimates else ""),
            f"Reserved   {amount(reserved):>10}",
            f"Headroom   {amount(headroom):>10}",
            f"Budget     {amount(budget):>10}  {verdict}",
            bar,
            f"Burn       {amount(burn):>10}/h",
            f"Projected  {projection}",
            f"{'Useful $/M' if unit == 'usd' else 'Useful /M '} {amount(number(money.get('useful_per_m'))):>10}",
            f"Waste      {amount(waste_total):>10}{waste_causes}",
            last,
        ]
        if estimates:
            lines[1:1] = [f"Estimated  {amount(estimated):>10}  {estimates}"]
        if len(self.lanes) > 1:
            lines.extend(lane_line(lane) for lane in self.lanes)
        return lines


def lane_line(lane: dict[str, Any]) -> str:
    """One backend's share of the job: rows, spend in its own unit, in flight against its limit."""
    money = lane.get("money") or {}
    unit = str(money.get("unit") or "usd")
    concurrency = lane.get("concurrency") or {}
    state = str(lane.get("state") or "running")
    flag = "" if state == "running" else f" [b $budget-warn]{escape(state)}[/]"
    rows = int(number(lane.get("rows")) or 0)
    return (
        f"{escape(str(lane.get('name') or '?')):<10} {rows} rows {fmt.percent(number(lane.get('rows_share')))}"
        f" · {fmt.amount(number(money.get('spent')), unit)}"
        f" · {int(number(lane.get('in_flight')) or 0)}/{int(number(concurrency.get('effective')) or 0)}{flag}"
    )


def estimate_words(money: dict[str, Any]) -> str:
    """What the estimated part of spend is: bills still to come, or worst cases nobody can confirm."""
    parts = []
    pending = money.get("pending") or {}
    unknowable = money.get("unknowable") or {}
    if (money.get("unit") or "usd") != "usd":
        # GPU time is measured, never billed later: only attempts cut by a cancel or a crash are
        # estimated, at their reservation (docs/money.md).
        cut = int(number(pending.get("requests")) or 0) + int(number(unknowable.get("requests")) or 0)
        return f"{cut} cut by a cancel or a crash: not metered" if cut else ""
    if number(pending.get("requests")):
        parts.append(f"{int(number(pending.get('requests')) or 0)} awaiting their bill")
    if number(unknowable.get("requests")):
        kept = "bounded by the key's usage" if money.get("unknowable_bound") == "key_usage" else "worst case kept"
        parts.append(f"{int(number(unknowable.get('requests')) or 0)} cut before an id: {kept}")
    return "; ".join(parts)


def servers_line(account: dict[str, Any] | None) -> str:
    """The SGLang servers' load, summed: what the GPU time is buying now."""
    servers = [s for s in (account or {}).get("servers") or [] if isinstance(s, dict)]
    if not servers:
        return "-"

    def total(key: str) -> float:
        return sum(number(s.get(key)) or 0.0 for s in servers)

    kv = max((number(s.get("kv_usage")) or 0.0 for s in servers), default=0.0)
    down = sum(1 for s in servers if s.get("down"))
    text = (
        f"{fmt.count(total('running'))} running · {fmt.count(total('queued'))} queued · "
        f"KV {fmt.percent(kv)} · {fmt.rate(total('gen_throughput'))} tok/s"
    )
    return text + (f" · [b $error]{down} down[/]" if down else "")
