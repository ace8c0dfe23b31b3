"""Modal screens: confirmations (exclude, budget, deadline, a backend to pause, stop), help, and a
provider's detail."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from regen.console import format as fmt
from regen.console.history import History, provider_status, slug_of
from regen.console.widgets.fleets import state_word
from regen.console.widgets.providers import STATUS_GLYPH
from regen.console.widgets.spark import ZeroSparkline
from regen.engine.durations import duration
from regen.engine.money.fleetplan import DeadlineError, parse_deadline
from regen.engine.schema import FleetView, LaneView, MoneyView, ProviderView, Snapshot, budget_lane
from regen.engine.units import DOLLARS

MODAL_CSS = """
{name} {{
    align: center middle;
    background: $background 60%;
}}
{name} > Vertical {{
    width: 72;
    max-width: 95%;
    height: auto;
    max-height: 90%;
    border: thick $primary;
    background: $surface;
    padding: 1 2;
}}
{name} .title {{
    text-style: bold;
    color: $primary;
    margin-bottom: 1;
}}
{name} .error {{
    color: $error;
    text-style: bold;
}}
{name} Horizontal {{
    height: auto;
    margin-top: 1;
    align-horizontal: right;
}}
{name} Button {{
    margin-left: 2;
}}
"""


@dataclass(frozen=True, slots=True)
class ExcludeImpact:
    """What excluding a provider does to routing, for the confirmation text."""

    name: str
    slug: str
    remaining: int
    allowed: int
    share: float
    in_flight: int

    @property
    def text(self) -> str:
        if self.remaining == 0:
            return (
                f"No other provider has served this job yet ({fmt.percent(self.share)} of traffic is here). "
                "The job refuses if no other provider is allowed; otherwise new requests go to the others."
            )
        return (
            f"{self.remaining} of {self.allowed} providers remain; {fmt.percent(self.share)} of traffic moves to them. "
            f"Its {self.in_flight} requests in flight finish (they are billed); new requests carry it in ignore."
        )


def exclude_impact(providers: list[ProviderView], slug: str) -> ExcludeImpact | None:
    """The impact of excluding `slug`, or None when it is not in the snapshot."""
    target = next((p for p in providers if slug_of(p) == slug), None)
    if target is None:
        return None
    allowed = [p for p in providers if p["allowed"] and not p["excluded"]]
    return ExcludeImpact(
        name=target["name"] or slug,
        slug=slug,
        remaining=len([p for p in allowed if slug_of(p) != slug]),
        allowed=len(allowed),
        share=target["share"],
        in_flight=target["in_flight"],
    )


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question about a destructive action; focus starts on Cancel."""

    DEFAULT_CSS = MODAL_CSS.format(name="ConfirmScreen")
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes", id="confirm-yes", tooltip="Do it"),
        Binding("n", "answer(False)", "No", id="confirm-no", tooltip="Leave things as they are"),
        Binding(
            "escape,q", "answer(False)", "Cancel", id="confirm-cancel", tooltip="Leave things as they are"
        ),
    ]

    def __init__(self, title: str, body: str, yes_label: str) -> None:
        super().__init__()
        self.title_text = title
        self.body = body
        self.yes_label = yes_label

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text, classes="title", markup=False)
            yield Static(self.body, markup=False, id="body")
            with Horizontal():
                yield Button(Content("Cancel [n]"), id="no", variant="default")
                yield Button(Content(f"{self.yes_label} [y]"), id="yes", variant="error")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class BudgetScreen(ModalScreen[float | None]):
    """A new budget in dollars; refuses a value below what is already spent."""

    DEFAULT_CSS = MODAL_CSS.format(name="BudgetScreen")
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="budget-cancel", tooltip="Keep the budget"),
    ]

    def __init__(self, money: MoneyView | None) -> None:
        """`money`: the budget lane's (None before the first snapshot)."""
        super().__init__()
        self.spent = 0.0 if money is None else money["spent"]
        self.reserved = 0.0 if money is None else money["reserved"]
        self.budget = None if money is None else money["budget"]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Set the budget", classes="title")
            yield Static(
                f"Spent {fmt.amount(self.spent, DOLLARS, 'cents')}, reserved for requests in flight {fmt.amount(self.reserved, DOLLARS, 'cents')}, "
                f"budget now {fmt.amount(self.budget, DOLLARS, 'cents')}. The new budget cannot be below what is spent.",
                markup=False,
            )
            yield Input(
                value="" if self.budget is None else f"{self.budget:.2f}",
                type="number",
                placeholder="dollars",
                id="budget-value",
            )
            yield Label("", classes="error", id="budget-error", markup=False)
            with Horizontal():
                yield Button(Content("Cancel [esc]"), id="cancel")
                yield Button(Content("Set [enter]"), id="set", variant="primary")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def check(self, text: str) -> float | str:
        """The budget typed, or why it is refused."""
        try:
            value = float(text)
        except ValueError:
            return "type a number of dollars"
        if value != value or value in (float("inf"), float("-inf")):
            return "type a number of dollars"
        if value < self.spent:
            return f"{fmt.amount(value, DOLLARS, 'cents')} is below what is already spent ({fmt.amount(self.spent, DOLLARS, 'cents')})"
        return value

    @on(Input.Submitted)
    @on(Button.Pressed, "#set")
    def _submit(self) -> None:
        result = self.check(self.query_one(Input).value.strip())
        if isinstance(result, str):
            self.query_one("#budget-error", Label).update(result)
            return
        self.dismiss(result)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


class LaneScreen(ModalScreen[str | None]):
    """Which backend to pause or resume: the job's lanes with their states; the others run on."""

    DEFAULT_CSS = (
        MODAL_CSS.format(name="LaneScreen")
        + """
    LaneScreen OptionList { height: auto; max-height: 10; }
    """
    )
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "cancel", "Cancel", id="lane-cancel", tooltip="Leave every backend as it is"),
    ]

    def __init__(self, lanes: list[LaneView]) -> None:
        super().__init__()
        self.lanes = lanes

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Pause or resume one backend", classes="title")
            yield Static(
                "Requests in flight on a paused backend finish (they are billed); the other backends go on.",
                markup=False,
            )
            options = []
            for lane in self.lanes:
                name = lane["name"]
                verb = "resume" if lane["state"] == "paused" else "pause"
                in_flight = lane["in_flight"]
                options.append(
                    Option(
                        Content.from_markup(
                            f"{escape(name):<12} {state_word(lane)} · {in_flight} in flight  → [b]{verb}[/]"
                        ),
                        id=name,
                    )
                )
            yield OptionList(*options, id="lanes")
            with Horizontal():
                yield Button(Content("Cancel [esc]"), id="cancel")

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()

    @on(OptionList.OptionSelected)
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


class DeadlineScreen(ModalScreen[str | None]):
    """A new deadline: a duration (12h, 90m), a time of day (06:30), or none; checked by the job's rules."""

    DEFAULT_CSS = MODAL_CSS.format(name="DeadlineScreen")
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="deadline-cancel", tooltip="Keep the deadline"),
    ]

    def __init__(self, fleet: FleetView | None) -> None:
        """`fleet`: the deadline controller's view (None in a job without one)."""
        super().__init__()
        self.current = None if fleet is None else fleet["deadline"]
        self.time_left = None if fleet is None else fleet["time_left_s"]

    def compose(self) -> ComposeResult:
        now = "none" if not self.current else f"{self.current}, {duration(self.time_left, 'coarse')} left"
        with Vertical():
            yield Label("Set the deadline", classes="title")
            yield Static(
                f"Deadline now: {now}. A duration (12h, 90m, 1h30m), a time of day (06:30, its next "
                "occurrence), or none. OpenRouter is paced to carry what the GPUs cannot make by then.",
                markup=False,
            )
            yield Input(
                value=str(self.current or ""), placeholder="12h, 90m, 06:30 or none", id="deadline-value"
            )
            yield Label("", classes="error", id="deadline-error", markup=False)
            with Horizontal():
                yield Button(Content("Cancel [esc]"), id="cancel")
                yield Button(Content("Set [enter]"), id="set", variant="primary")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    @staticmethod
    def check(text: str) -> str | None:
        """Why `text` is refused (the job's own parser and message), or None when it is a deadline."""
        if not text:
            return "type a deadline (12h, 90m, 06:30), or none to take it away"
        if text.lower() == "none":
            return None
        try:
            parse_deadline(text)
        except DeadlineError as exc:
            return str(exc)
        return None

    @on(Input.Submitted)
    @on(Button.Pressed, "#set")
    def _submit(self) -> None:
        text = self.query_one(Input).value.strip()
        problem = self.check(text)
        if problem is not None:
            self.query_one("#deadline-error", Label).update(problem)
            return
        self.dismiss(text)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


class StopScreen(ModalScreen[str | None]):
    """Stopping the job is typed, not pressed: "stop", then drain (default) or cancel."""

    DEFAULT_CSS = MODAL_CSS.format(name="StopScreen")
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back", id="stop-back", tooltip="Keep the job running"),
    ]
    WORD = "stop"

    def __init__(self, in_flight: int) -> None:
        super().__init__()
        self.in_flight = in_flight

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Stop the job", classes="title")
            yield Static(
                f"The job stops dispatching. {self.in_flight} requests are in flight: "
                "drain lets them finish (billed and kept); cancel drops them (billed, re-sent by the next run). "
                f'Type "{self.WORD}" to confirm. Quitting the console (q) does not stop the job.',
                markup=False,
            )
            yield Input(placeholder=f'type "{self.WORD}"', id="stop-word")
            with Horizontal():
                yield Button(Content("Back [esc]"), id="back")
                yield Button("Cancel in-flight", id="cancel", variant="error", disabled=True)
                yield Button(Content("Drain [enter]"), id="drain", variant="warning", disabled=True)

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    @on(Input.Changed)
    def _typed(self, event: Input.Changed) -> None:
        ready = event.value.strip().lower() == self.WORD
        for button_id in ("#cancel", "#drain"):
            self.query_one(button_id, Button).disabled = not ready

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        if event.value.strip().lower() == self.WORD:
            self.dismiss("drain")

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None if event.button.id == "back" else event.button.id)

    def action_back(self) -> None:
        self.dismiss(None)


@dataclass(frozen=True, slots=True)
class HelpEntry:
    """One key and what it does."""

    keys: str
    description: str
    group: str


class HelpScreen(ModalScreen[None]):
    """Every binding with its current keys (after the keymap), generated, never hand-written."""

    DEFAULT_CSS = (
        MODAL_CSS.format(name="HelpScreen")
        + """
    HelpScreen > Vertical { width: 84; }
    HelpScreen VerticalScroll { height: auto; max-height: 30; }
    """
    )
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "close", "Close", id="help-close", tooltip="Close help"),
    ]

    def __init__(self, entries: Iterable[HelpEntry], readonly: bool) -> None:
        super().__init__()
        self.entries = list(entries)
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("regen keys", classes="title")
            lines: list[str] = []
            group = None
            for entry in self.entries:
                if entry.group != group:
                    group = entry.group
                    lines.append(f"{'' if not lines else chr(10)}[b $primary]{escape(group)}[/]")
                lines.append(f"  [b]{escape(entry.keys):<14}[/] {escape(entry.description)}")
            if self.readonly:
                lines.append("\n[b $warning]READ-ONLY[/]: this console watches; steering keys are disabled.")
            lines.append("\nKeys are remapped in settings by binding id ([console.keymap]).")
            with VerticalScroll():
                yield Static(Content.from_markup("\n".join(lines)), id="help-text")

    def action_close(self) -> None:
        self.dismiss(None)


def fidelity_lines(provider: ProviderView) -> str:
    """The route's fingerprint for the detail screen (docs/fidelity.md): its state and reference,
    the evidence of a flag, and each statistic against the reference with its p-value."""
    view = provider.get("fidelity")
    if view is None:
        return ""
    state = {"drift": "DRIFT", "ok": "ok", "learning": "learning"}[view["state"]]
    against = view["against"] or "nothing yet"
    similarity = view["finish_similarity"]
    mix = "" if similarity is None else f", finish-mix similarity {similarity:.1%}"
    lines = [
        f"\nfidelity      {state}: {view['responses']} answers against {against} ({view['reference_responses']}){mix}"
    ]
    if view["evidence"]:
        lines.append(f"  evidence    {view['evidence']}" + (f" [{view['action']}]" if view["action"] else ""))
    for stat in view["stats"]:
        p = "-" if stat["p"] is None else f"{stat['p']:.1e}"
        mark = " ✗" if stat["flagged"] else ""
        lines.append(f"  {stat['name']:<16} {stat['value']:>22}  vs {stat['reference']:<22} p {p}{mark}")
    return "\n".join(lines)


class ProviderDetailScreen(ModalScreen[None]):
    """One provider: every number, its sparklines, its recent errors; refreshed with each snapshot."""

    DEFAULT_CSS = (
        MODAL_CSS.format(name="ProviderDetailScreen")
        + """
    ProviderDetailScreen > Vertical { width: 100; height: 90%; }
    ProviderDetailScreen ZeroSparkline { height: 3; margin-bottom: 1; }
    ProviderDetailScreen .muted { color: $text-muted; }
    ProviderDetailScreen #detail-errors { height: 1fr; }
    """
    )
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,enter", "close", "Close", id="detail-close", tooltip="Back to the console"),
    ]

    def __init__(self, slug: str) -> None:
        super().__init__()
        self.slug = slug

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.slug, classes="title", id="detail-title", markup=False)
            yield Static("", id="detail-numbers")
            yield Label("latency p50", classes="muted", id="detail-latency-label")
            yield ZeroSparkline([], id="detail-latency")
            yield Label("output tok/s", classes="muted", id="detail-tokens-label")
            yield ZeroSparkline([], id="detail-tokens")
            with VerticalScroll(id="detail-errors"):
                yield Static("", id="detail-errors-text")

    def show(self, snap: Snapshot, history: History) -> None:
        """Repaint from a snapshot (the routes of its budget lane, as the providers pane shows them);
        says so when the provider is no longer in it."""
        providers = budget_lane(snap)["providers"]
        provider = next((p for p in providers if slug_of(p) == self.slug), None)
        if provider is None:
            self.query_one("#detail-numbers", Static).update(f"{self.slug} is not in the latest snapshot")
            return
        status = provider_status(provider)
        name = provider["name"] or self.slug
        self.query_one("#detail-title", Label).update(
            f"{name} ({self.slug}) · {STATUS_GLYPH[status]} {status}"
        )
        errors = provider["errors"]
        rows = [
            ("requests", fmt.count(provider["requests"])),
            ("ok", fmt.count(provider["ok"])),
            ("share", fmt.percent(provider["share"], 1)),
            ("in flight", fmt.count(provider["in_flight"])),
            ("spent", fmt.amount(provider["spent"], DOLLARS, "cents")),
            ("$/M output", fmt.amount(provider["cost_per_m_output"], DOLLARS, "cents")),
            ("output tokens", fmt.count(provider["output_tokens"])),
            ("tok/s", fmt.rate(provider["output_tokens_per_s"])),
            ("latency p50", fmt.seconds(provider["latency_p50_s"])),
            ("latency p95", fmt.seconds(provider["latency_p95_s"])),
            ("latency p99", fmt.seconds(provider["latency_p99_s"])),
            ("TTFT p50", fmt.seconds(provider["ttft_p50_s"])),
            ("TTFT p95", fmt.seconds(provider["ttft_p95_s"])),
            ("time/token", fmt.seconds(provider["tpot_s"])),
        ]
        cells = [f"{label:<13} {value:>9}" for label, value in rows]
        grid = "\n".join("   ".join(cells[i : i + 3]) for i in range(0, len(cells), 3))
        by_class = ", ".join(f"{k} {v}" for k, v in sorted(errors.items())) or "none"
        reason = provider["reason"]
        note = f"\n{'kept out' if not provider['allowed'] else 'note':<13} {reason}" if reason else ""
        fidelity = fidelity_lines(provider)
        self.query_one("#detail-numbers", Static).update(
            Content(f"{grid}\nerrors        {by_class}{note}{fidelity}")
        )
        window = history.providers.get(self.slug)
        if window is not None:
            self.query_one("#detail-latency", ZeroSparkline).data = list(window.latency_p50_s)
            self.query_one("#detail-tokens", ZeroSparkline).data = list(window.output_tokens_per_s)
        recent = provider["recent_errors"]
        lines = ["[b]recent errors[/]"]
        for error in recent[-10:]:
            lines.append(
                f"{fmt.wall_time(error['ts'])} [b $error]{escape(str(error['class']))}[/] {escape(error['message'])}"
            )
        if not recent:
            lines.append("none")
        self.query_one("#detail-errors-text", Static).update(Content.from_markup("\n".join(lines)))

    def action_close(self) -> None:
        self.dismiss(None)
