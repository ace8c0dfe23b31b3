"""The fleets pane: a job on both fleets at once (docs/console.md, "Two fleets").

One block per backend in the job's order (its state word, rows and share, output tokens, tok/s,
money in its own unit, requests in flight against its limit and the deadline controller's ceiling),
its busiest providers or workers under it, then the plan: the deadline and the time left, the ETA
against it, whether the plan fits, the projected dollars against the budget, both fleets' rates and
the controller's one line. GPU hosts stay in the host pane.
"""

from __future__ import annotations

import textwrap

from textual import events
from textual.content import Content
from textual.markup import escape

from regen.console import format as fmt
from regen.console.widgets.text import TextPane
from regen.engine.durations import duration
from regen.engine.schema import FleetView, LaneView, MoneyView, Snapshot, budget_lane
from regen.engine.units import DOLLARS

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
    "stalled": "$error",
    "closed": "$error",
}


def shows_fleets(snap: Snapshot | None) -> bool:
    """Whether a snapshot is of a two-fleet job: several lanes, or the deadline controller's view."""
    if snap is None:
        return False
    return len(snap["lanes"]) > 1 or "fleet" in snap


def state_word(lane: LaneView) -> str:
    """A lane's state as a coloured word, e.g. RUNNING, PAUSED."""
    state = lane["state"]
    return f"[b {STATE_COLOUR.get(state, '$warning')}]{escape(state.upper())}[/]"


def lane_lines(lane: LaneView, top: int = TOP_ROUTES, *, compact: bool = False) -> list[str]:
    """One backend: a heading, its output and money, its limit, then its busiest routes (compact: two
    lines, no routes)."""
    money = lane["money"]
    name = escape(lane["name"])
    heading = (
        f"[b]{name}[/] {state_word(lane)} {fmt.count(lane['rows'])} rows {fmt.percent(lane['rows_share'])}"
    )
    reason = lane["reason"]
    lines = [heading]
    if reason and lane["state"] != "running":
        lines.append(f"  [$warning]{escape(reason)}[/]")
    made = (
        f"  {fmt.count(lane['output_tokens'])} tok · "
        f"{fmt.rate(lane['rates']['output_tokens_per_s'])} tok/s · {fmt.amount(money['spent'], lane['unit'], 'cents')}"
    )
    in_flight = f"{lane['in_flight']}/{lane['concurrency']['effective']}"
    ceiling = lane["ceiling"]
    if compact:
        return [*lines, made + f" · {in_flight}" + ("" if ceiling is None else f" ≤{ceiling}")]
    limit = f"  in flight {in_flight}"
    if ceiling is not None:
        limit += f" · ceiling {ceiling}"
    lines.extend([made, limit])
    lines.extend(route_lines(lane, top))
    return lines


def route_lines(lane: LaneView, top: int = TOP_ROUTES) -> list[str]:
    """The lane's busiest providers (OpenRouter) or workers (SGLang), by requests."""
    routes = [r for r in lane["providers"] if r["requests"]]
    routes.sort(key=lambda r: (-r["requests"], r["name"]))
    lines = []
    for route in routes[:top]:
        lines.append(
            f"  [$text-muted]{escape(route['status']):<4}[/] {escape((route['name'] or route['slug'])[:14]):<14}"
            f" {fmt.count(route['requests']):>6} req {fmt.percent(route['share']):>4}"
        )
    hidden = len(routes) - top
    if hidden > 0:
        lines.append(f"  [$text-muted]+{hidden} more[/]")
    return lines


def deadline_line(fleet: FleetView) -> str:
    """The deadline as set, its local time, and the time left (or how long ago it passed)."""
    deadline = fleet["deadline"]
    if not deadline:
        return "[b]Plan[/] no deadline: both fleets flat out"
    when = fleet["deadline_ts"]
    at = "" if when is None else f" ({fmt.wall_time(when)[:5]})"
    left = fleet["time_left_s"]
    if left is not None and left < 0:
        return f"[b]Plan[/] deadline {escape(deadline)}{at} [b $warning]passed {duration(-left, 'coarse')} ago[/]"
    return f"[b]Plan[/] deadline {escape(deadline)}{at} · {duration(left, 'coarse')} left"


def plan_lines(
    fleet: FleetView, money: MoneyView, width: int = 40, reason_lines: int = REASON_LINES
) -> list[str]:
    """The plan: deadline, ETA against it, fit, projected dollars against `money`'s budget (the budget
    lane's), both rates, the ceiling, the reason; the parts share lines as the width allows."""
    left = fleet["time_left_s"] if fleet["deadline"] else None
    eta, late = fmt.against_deadline(fleet["eta_s"], left)
    # The job's words for the verdict (docs/fleets.md, "The verdict"): never "fits" beside figures
    # that say otherwise; "at risk" while a standing "fits" waits for evidence, red once it cannot.
    # A job from before the words were sent (recorded frames, an older job attached) has only `fits`.
    verdict = fleet.get("verdict") or ("fits" if fleet["fits"] else "does not fit")
    colour = "$success" if verdict == "fits" else "$warning" if verdict.startswith("at risk") else "$error"
    fits = f"[b {colour}]{escape(verdict)}[/]"
    projected = fleet["projected_usd"]
    budget = money["budget"] if money["unit"] == DOLLARS else None
    spend = f"projected {fmt.amount(projected, DOLLARS, 'cents')}"
    if budget is not None:
        spend += f" of {fmt.amount(budget, DOLLARS, 'cents')}"
        if projected is not None and projected > budget:
            spend += f" [b $budget-warn]over by {fmt.amount(projected - budget, DOLLARS, 'cents')}[/]"
    ceiling = fleet["ceiling"]
    aim = fleet["aim_tokens_per_s"]
    groups = [
        [f"[b $warning]{escape(eta)}[/]" if late else escape(eta)],
        [fits, spend],
        [
            f"GPU {fmt.rate(fleet['gpu_tokens_per_s'])} tok/s",
            f"OpenRouter {fmt.rate(fleet['openrouter_tokens_per_s'])} tok/s",
        ],
        [
            "ceiling "
            + ("none: flat out" if ceiling is None else f"{ceiling} in flight")
            + ("" if aim is None else f" · aims {fmt.rate(aim)} tok/s")
        ],
    ]
    lines = pack(deadline_line(fleet), groups, width)
    reason = fleet["reason"]
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


def fleet_lines(snap: Snapshot, width: int = 40, *, compact: bool = False) -> list[str]:
    """Every line of the pane for a snapshot: the backends (side by side when the width allows), then
    the plan. Compact (a narrow terminal's bottom strip) keeps the plan and drops the routes."""
    blocks = [lane_lines(lane, compact=compact) for lane in snap["lanes"]]
    lines = side_by_side(blocks, width)
    fleet = snap.get("fleet")
    if fleet is not None:
        lines.extend(plan_lines(fleet, budget_lane(snap)["money"], width, 2 if compact else REASON_LINES))
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
        self.snap: Snapshot | None = None
        self.compact = compact

    def show(self, snap: Snapshot) -> None:
        """Repaint from a snapshot."""
        self.snap = snap
        self._paint()

    def on_resize(self, event: events.Resize) -> None:
        self._paint()

    def _paint(self) -> None:
        width = self.content_size.width or 40
        self.show_lines(
            fleet_lines(self.snap, width, compact=self.compact)
            if self.snap is not None
            else ["waiting for data"]
        )
