"""The cost pane: spent, reserved, headroom, a budget bar, burn rate, projection and waste, in the
ledger's unit (dollars, or GPU time for SGLang, which has no budget but servers to show). A job with
several backends adds one line per backend: its rows and their share, its spend in its own unit,
its requests in flight against its limit."""

from __future__ import annotations

from textual import events
from textual.markup import escape

from regen.console import format as fmt
from regen.console.widgets.bars import segments
from regen.console.widgets.text import TextPane
from regen.engine.schema import AccountView, LaneView, MoneyView, SGLangAccount, Snapshot, budget_lane
from regen.engine.units import DOLLARS

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
        self.money: MoneyView | None = None
        self.account: AccountView | None = None
        self.lanes: list[LaneView] = []
        self.budget_warn_fraction = 0.8

    def show(self, snap: Snapshot) -> None:
        """Repaint from a snapshot: the money and account of the lane holding the budget
        (engine/schema.py budget_lane), and with several backends a line for each."""
        lane = budget_lane(snap)
        self.money = lane["money"]
        self.account = lane["account"]
        self.lanes = snap["lanes"]
        self._paint()

    def on_resize(self, event: events.Resize) -> None:
        self._paint()

    def _paint(self) -> None:
        self.show_lines(["waiting for data"] if self.money is None else self._lines())

    def _lines(self) -> list[str]:
        money = self.money
        assert money is not None, "painted only once a snapshot came"
        unit = money["unit"]

        def amount(value: float | None) -> str:
            return fmt.amount(value, unit, "cents")

        spent, reserved, estimated, budget = (
            money["spent"],
            money["reserved"],
            money["estimated"],
            money["budget"],
        )
        headroom = None if budget is None else budget - spent - reserved
        used = (spent + reserved) / budget if budget else None
        if budget is None and unit != DOLLARS:
            bar_colour, verdict = "$primary", "none: GPU time is counted, not capped"
        elif money["blocked"]:
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
        burn = money["burn_per_h"]
        projected = money["projected_total"]
        projection = f"{amount(projected):>10}"
        if projected is not None and budget is not None:
            projection += (
                f" [b $budget-warn]over by {amount(projected - budget)}[/]" if projected > budget else " fits"
            )
        waste = money["waste"]
        waste_total = sum(w["amount"] for w in waste.values())
        # Every cause is always listed in the snapshot: name only those that wasted something.
        causes = [
            f"{escape(cause)} {amount(w['amount'])}"
            for cause, w in waste.items()
            if w["amount"] or w["tokens"]
        ]
        waste_causes = f" ({', '.join(causes)})" if causes else ""
        estimate = f" (~{amount(estimated)} est.)" if estimated > 0.005 else ""
        estimates = estimate_words(money)
        account = self.account
        if account is None or account["kind"] == "openrouter":
            credits_left = None if account is None else account.get("limit_remaining")
            last = f"Credits    {amount(credits_left):>10} left"
        else:
            last = f"Servers    {servers_line(account)}"
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
            + (f"  {amount(money['confirmed'])} billed" if estimates else ""),
            f"Reserved   {amount(reserved):>10}",
            f"Headroom   {amount(headroom):>10}",
            f"Budget     {amount(budget):>10}  {verdict}",
            bar,
            f"Burn       {amount(burn):>10}/h",
            f"Projected  {projection}",
            f"{'Useful $/M' if unit == DOLLARS else 'Useful /M '} {amount(money['useful_per_m']):>10}",
            f"Waste      {amount(waste_total):>10}{waste_causes}",
            last,
        ]
        pending, unknowable = money["pending"], money["unknowable"]
        if unit == DOLLARS and pending["requests"] and unknowable["requests"]:
            # Both kinds: the money whose bill is coming apart from the money no bill can name.
            lines[1:1] = [
                f"Pending    {amount(pending['amount']):>10}  {pending['requests']} awaiting their bill",
                f"Unknowable {amount(unknowable['amount']):>10}  {unknowable_words(money)}",
            ]
        elif estimates:
            lines[1:1] = [f"Estimated  {amount(estimated):>10}  {estimates}"]
        if len(self.lanes) > 1:
            lines.extend(lane_line(lane) for lane in self.lanes)
        return lines


def lane_line(lane: LaneView) -> str:
    """One backend's share of the job: rows, spend in its own unit, in flight against its limit."""
    money = lane["money"]
    state = lane["state"]
    flag = "" if state == "running" else f" [b $budget-warn]{escape(state)}[/]"
    return (
        f"{escape(lane['name']):<10} {lane['rows']} rows {fmt.percent(lane['rows_share'])}"
        f" · {fmt.amount(money['spent'], money['unit'], 'cents')}"
        f" · {lane['in_flight']}/{lane['concurrency']['effective']}{flag}"
    )


def estimate_words(money: MoneyView) -> str:
    """What the estimated part of spend is: bills still to come, or worst cases nobody can confirm."""
    parts = []
    pending = money["pending"]["requests"]
    unknowable = money["unknowable"]["requests"]
    if money["unit"] != DOLLARS:
        # GPU time is measured, never billed later: only attempts cut by a cancel or a crash are
        # estimated, at their reservation (docs/money.md).
        cut = pending + unknowable
        return f"{cut} cut by a cancel or a crash: not metered" if cut else ""
    if pending:
        parts.append(f"{pending} awaiting their bill")
    if unknowable:
        parts.append(unknowable_words(money))
    return "; ".join(parts)


def unknowable_words(money: MoneyView) -> str:
    kept = "bounded by the key's usage" if money.get("unknowable_bound") == "key_usage" else "worst case kept"
    return f"{money['unknowable']['requests']} cut before an id: {kept}"


def servers_line(account: SGLangAccount) -> str:
    """The SGLang servers' load, summed: what the GPU time is buying now."""
    servers = account["servers"]
    if not servers:
        return "-"
    kv = max((s["kv_usage"] or 0.0 for s in servers), default=0.0)
    down = sum(1 for s in servers if s["down"])
    running = sum(s["running"] or 0.0 for s in servers)
    queued = sum(s["queued"] or 0.0 for s in servers)
    throughput = sum(s["gen_throughput"] or 0.0 for s in servers)
    text = (
        f"{fmt.count(running)} running · {fmt.count(queued)} queued · "
        f"KV {fmt.percent(kv)} · {fmt.rate(throughput)} tok/s"
    )
    return text + (f" · [b $error]{down} down[/]" if down else "")
