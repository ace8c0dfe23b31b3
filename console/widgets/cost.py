"""The cost pane: spent, reserved, headroom, a budget bar, burn rate, projection and waste."""

from __future__ import annotations

from typing import Any

from textual import events
from textual.markup import escape

from console import format as fmt
from console.format import number
from console.widgets.bars import segments
from console.widgets.text import TextPane

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
        self.budget_warn_fraction = 0.8

    def show(self, snap: dict[str, Any], burn_per_h: float | None = None) -> None:
        """Repaint from a snapshot (with the console's burn rate when the job sends none)."""
        self.money = dict(snap.get("money") or {})
        if burn_per_h is not None:
            self.money["burn_per_h"] = burn_per_h
        account = (snap.get("backend") or {}).get("account")
        self.credits = account if isinstance(account, dict) else None
        self._paint()

    def on_resize(self, event: events.Resize) -> None:
        self._paint()

    def _paint(self) -> None:
        self.show_lines(self._lines() if self.money else ["waiting for data"])

    def _lines(self) -> list[str]:
        money = self.money
        spent = number(money.get("spent")) or 0.0
        reserved = number(money.get("reserved")) or 0.0
        estimated = number(money.get("estimated")) or 0.0
        budget = number(money.get("budget"))
        headroom = None if budget is None else budget - spent - reserved
        used = (spent + reserved) / budget if budget else None
        if money.get("blocked"):
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
        projection = f"{fmt.money(projected):>10}"
        if projected is not None and budget is not None:
            projection += (
                f" [b $budget-warn]over by {fmt.money(projected - budget)}[/]"
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
                f"{escape(str(cause))} {fmt.money(number((w or {}).get('amount')))}"
                for cause, w in waste.items()
                if number((w or {}).get("amount")) or number((w or {}).get("tokens"))
            )
            + ")"
        )
        estimate = f" (~{fmt.money(estimated)} est.)" if estimated > 0.005 else ""
        estimates = estimate_words(money)
        credits_left = None if self.credits is None else number(self.credits.get("limit_remaining"))
        if width < COMPACT_BELOW:
            return [
                f"{fmt.money(spent)} spent + {fmt.money(reserved)} rsv{estimate}",
                bar,
                f"{verdict} of {fmt.money(budget)}",
                f"headroom {fmt.money(headroom)} · {fmt.money(burn)}/h",
                f"projected {projection.strip()}",
            ]
        lines = [
            f"Spent      {fmt.money(spent):>10}"
            + (f"  {fmt.money(number(money.get('confirmed')))} billed" if estimates else ""),
            f"Reserved   {fmt.money(reserved):>10}",
            f"Headroom   {fmt.money(headroom):>10}",
            f"Budget     {fmt.money(budget):>10}  {verdict}",
            bar,
            f"Burn       {fmt.money(burn):>10}/h",
            f"Projected  {projection}",
            f"Useful $/M {fmt.money(number(money.get('useful_per_m'))):>10}",
            f"Waste      {fmt.money(waste_total):>10}{waste_causes}",
            f"Credits    {fmt.money(credits_left):>10} left",
        ]
        if estimates:
            lines[1:1] = [f"Estimated  {fmt.money(estimated):>10}  {estimates}"]
        return lines


def estimate_words(money: dict[str, Any]) -> str:
    """What the estimated part of spend is: bills still to come, or worst cases nobody can confirm."""
    parts = []
    pending = money.get("pending") or {}
    unknowable = money.get("unknowable") or {}
    if number(pending.get("requests")):
        parts.append(f"{int(number(pending.get('requests')) or 0)} awaiting their bill")
    if number(unknowable.get("requests")):
        parts.append(f"{int(number(unknowable.get('requests')) or 0)} cut before an id: worst case kept")
    return "; ".join(parts)
