"""The fleets pane: a job on both fleets at once (docs/console.md, "Two fleets").

One block per backend in the job's order (its state word, rows and share, output tokens, tok/s,
money in its own unit, requests in flight against its limit and the deadline controller's ceiling),
its busiest providers or workers under it, then the plan: the deadline and the time left, the ETA
against it, whether the plan fits, the projected dollars against the budget, both fleets' rates and
the controller's one line. GPU hosts stay in the host pane.
"""

from __future__ import annotations

import textwrap
from typing import Any

from textual import events
from textual.content import Content
from textual.markup import escape

from regen.console import format as fmt
from regen.console.format import number
from regen.console.widgets.text import TextPane
from regen.engine.durations import duration

# Providers (or workers) shown under each backend: the busiest by requests.
TOP_ROUTES = 3
# The controller's line wraps to at most this many lines.
REASON_LINES = 3
# A backend's block is this many cells wide at most: a wide pane puts the backends side by side.
LANE_COLUMN = 46
# A lane's state word and the theme variable it is written in (the word carries the meaning).
STATE_COLOUR = {
    "running": "$success",
    "paused": "$warning",
    "held": "$warning",
    "budget": "$budget-over",
    "out": "$error",
    "closed": "$error",
}


def shows_fleets(snap: dict[str, Any] | None) -> bool:
    """Whether a snapshot is of a two-fleet job: several lanes, or the deadline controller's view."""
    if not snap:
        return False
    lanes = snap.get("lanes")
    return (isinstance(lanes, list) and len(lanes) > 1) or isinstance(snap.get("fleet"), dict)


def lanes_of(snap: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The snapshot's lanes, in the job's order."""
    lanes = (snap or {}).get("lanes")
    return [lane for lane in lanes if isinstance(lane, dict)] if isinstance(lanes, list) else []


def state_word(lane: dict[str, Any]) -> str:
    """A lane's state as a coloured word, e.g. RUNNING, PAUSED."""
    state = str(lane.get("state") or "running")
    return f"[b {STATE_COLOUR.get(state, '$warning')}]{escape(state.upper())}[/]"


def lane_lines(lane: dict[str, Any], top: int = TOP_ROUTES, *, compact: bool = False) -> list[str]:
    """One backend: a heading, its output and money, its limit, then its busiest routes (compact: two
    lines, no routes)."""
    money = lane.get("money") or {}
    unit = str(lane.get("unit") or money.get("unit") or "usd")
    concurrency = lane.get("concurrency") or {}
    rates = lane.get("rates") or {}
    name = escape(str(lane.get("name") or "?"))
    rows = int(number(lane.get("rows")) or 0)
    heading = f"[b]{name}[/] {state_word(lane)} {fmt.count(rows)} rows {fmt.percent(number(lane.get('rows_share')))}"
    reason = lane.get("reason")
    lines = [heading]
    if reason and str(lane.get("state") or "running") != "running":
        lines.append(f"  [$warning]{escape(str(reason))}[/]")
    made = (
        f"  {fmt.count(number(lane.get('output_tokens')))} tok · "
        f"{fmt.rate(number(rates.get('output_tokens_per_s')))} tok/s · {fmt.amount(number(money.get('spent')), unit)}"
    )
    in_flight = f"{int(number(lane.get('in_flight')) or 0)}/{int(number(concurrency.get('effective')) or 0)}"
    ceiling = number(lane.get("ceiling"))
    if compact:
        return [*lines, made + f" · {in_flight}" + ("" if ceiling is None else f" ≤{int(ceiling)}")]
    limit = f"  in flight {in_flight}"
    if ceiling is not None:
        limit += f" · ceiling {int(ceiling)}"
    lines.extend([made, limit])
    lines.extend(route_lines(lane, top))
    return lines


def route_lines(lane: dict[str, Any], top: int = TOP_ROUTES) -> list[str]:
    """The lane's busiest providers (OpenRouter) or workers (SGLang), by requests."""
    routes = [r for r in lane.get("providers") or [] if isinstance(r, dict) and number(r.get("requests"))]
    routes.sort(key=lambda r: (-(number(r.get("requests")) or 0.0), str(r.get("name"))))
    lines = []
    for route in routes[:top]:
        status = str(route.get("status") or "")
        lines.append(
            f"  [$text-muted]{escape(status):<4}[/] {escape(str(route.get('name') or route.get('slug'))[:14]):<14}"
            f" {fmt.count(number(route.get('requests'))):>6} req {fmt.percent(number(route.get('share'))):>4}"
        )
    hidden = len(routes) - top
    if hidden > 0:
        lines.append(f"  [$text-muted]+{hidden} more[/]")
    return lines


def deadline_line(fleet: dict[str, Any]) -> str:
    """The deadline as set, its local time, and the time left (or how long ago it passed)."""
    deadline = fleet.get("deadline")
    if not deadline:
        return "[b]Plan[/] no deadline: both fleets flat out"
    when = number(fleet.get("deadline_ts"))
    at = "" if when is None else f" ({fmt.wall_time(when)[:5]})"
    left = number(fleet.get("time_left_s"))
    if left is not None and left < 0:
        return f"[b]Plan[/] deadline {escape(str(deadline))}{at} [b $warning]passed {duration(-left, 'coarse')} ago[/]"
    return f"[b]Plan[/] deadline {escape(str(deadline))}{at} · {duration(left, 'coarse')} left"


def plan_lines(
    fleet: dict[str, Any], money: dict[str, Any], width: int = 40, reason_lines: int = REASON_LINES
) -> list[str]:
    """The plan: deadline, ETA against it, fit, projected dollars, both rates, the ceiling, the reason;
    the parts share lines as the width allows."""
    has_deadline = bool(fleet.get("deadline"))
    left = number(fleet.get("time_left_s")) if has_deadline else None
    eta, late = fmt.against_deadline(number(fleet.get("eta_s")), left)
    fits = "[b $success]fits[/]" if fleet.get("fits") else "[b $error]does not fit[/]"
    projected = number(fleet.get("projected_usd"))
    budget = number(money.get("budget")) if (money.get("unit") or "usd") == "usd" else None
    spend = f"projected {fmt.money(projected)}"
    if budget is not None:
        spend += f" of {fmt.money(budget)}"
        if projected is not None and projected > budget:
            spend += f" [b $budget-warn]over by {fmt.money(projected - budget)}[/]"
    ceiling = number(fleet.get("ceiling"))
    aim = number(fleet.get("aim_tokens_per_s"))
    groups = [
        [f"[b $warning]{escape(eta)}[/]" if late else escape(eta)],
        [fits, spend],
        [
            f"GPU {fmt.rate(number(fleet.get('gpu_tokens_per_s')))} tok/s",
            f"OpenRouter {fmt.rate(number(fleet.get('openrouter_tokens_per_s')))} tok/s",
        ],
        [
            "ceiling "
            + ("none: flat out" if ceiling is None else f"{int(ceiling)} in flight")
            + ("" if aim is None else f" · aims {fmt.rate(aim)} tok/s")
        ],
    ]
    lines = pack(deadline_line(fleet), groups, width)
    reason = str(fleet.get("reason") or "")
    if reason:
        wrapped = textwrap.wrap(reason, max(20, width - 2))
        if len(wrapped) > reason_lines:
            rest = textwrap.shorten(" ".join(wrapped[reason_lines - 1 :]), max(20, width - 2))
            wrapped = [*wrapped[: reason_lines - 1], rest]
        lines.extend(f"  [$text-muted]{escape(part)}[/]" for part in wrapped)
    return lines


def pack(head: str, groups: list[list[str]], width: int) -> list[str]:
    """`head`, then each group's parts joined by " · " on as few lines as `width` allows (later lines
    indented); a group stays on one line unless it is wider than the pane, then its parts split."""

    def fits(text: str) -> bool:
        return Content.from_markup(text).cell_length <= width

    lines = [head]
    for group in groups:
        whole = " · ".join(group)
        if fits(f"{lines[-1]} · {whole}"):
            lines[-1] = f"{lines[-1]} · {whole}"
        elif fits(f"  {whole}") or len(group) == 1:
            lines.append(f"  {whole}")
        else:
            lines.extend(f"  {part}" for part in group)
    return lines


def fleet_lines(snap: dict[str, Any], width: int = 40, *, compact: bool = False) -> list[str]:
    """Every line of the pane for a snapshot: the backends (side by side when the width allows), then
    the plan. Compact (a narrow terminal's bottom strip) keeps the plan and drops the routes."""
    blocks = [lane_lines(lane, compact=compact) for lane in lanes_of(snap)]
    lines = side_by_side(blocks, width)
    fleet = snap.get("fleet")
    if isinstance(fleet, dict):
        lines.extend(plan_lines(fleet, snap.get("money") or {}, width, 2 if compact else REASON_LINES))
    return lines or ["waiting for data"]


def side_by_side(blocks: list[list[str]], width: int) -> list[str]:
    """Blocks of markup lines in columns of LANE_COLUMN cells, as many to a row as `width` holds."""
    per_row = max(1, min(len(blocks), width // LANE_COLUMN))
    if per_row == 1:
        return [line for block in blocks for line in block]
    lines: list[str] = []
    for start in range(0, len(blocks), per_row):
        group = blocks[start : start + per_row]
        for row in range(max(len(block) for block in group)):
            cells = [block[row] if row < len(block) else "" for block in group]
            padded = [
                cell + " " * max(1, LANE_COLUMN - Content.from_markup(cell).cell_length)
                for cell in cells[:-1]
            ]
            lines.append("".join([*padded, cells[-1]]).rstrip())
    return lines


class FleetsPane(TextPane):
    """Both fleets in one view: per backend, then per provider or worker, then the plan."""

    DEFAULT_CSS = """
    FleetsPane {
        padding: 0 1;
        background: $surface;
    }
    """

    def __init__(self, *, id: str | None = None, compact: bool = False) -> None:
        """`compact`: the short form, for a narrow terminal's bottom strip."""
        super().__init__(id=id)
        self.border_title = "Fleets"
        self.snap: dict[str, Any] = {}
        self.compact = compact

    def show(self, snap: dict[str, Any]) -> None:
        """Repaint from a snapshot."""
        self.snap = snap
        self._paint()

    def on_resize(self, event: events.Resize) -> None:
        self._paint()

    def _paint(self) -> None:
        width = self.content_size.width or 40
        self.show_lines(
            fleet_lines(self.snap, width, compact=self.compact) if self.snap else ["waiting for data"]
        )
