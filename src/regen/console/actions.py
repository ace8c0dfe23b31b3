"""The console's actions, listed once: the key bindings, the help screen and the command palette
are all made from this registry.

An action has an id (what `[console] keymap` remaps), the Textual action it runs, the keys that
run it (none for palette-only actions such as stopping the job), the words the footer, the help
screen and the palette show, its help group, whether it steers the job (steering actions are
offered only while the console may steer), and whether it belongs to a job on both fleets (those
are offered, and listed in help, only when the console shows the fleets pane).
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding

STEER, VIEW, CONSOLE = "Steer the job", "View", "Console"
GROUP_ORDER = (STEER, VIEW, CONSOLE)


@dataclass(frozen=True, slots=True)
class Action:
    id: str
    action: str  # the Textual action string, e.g. "concurrency(1)"
    keys: str | None  # comma-separated; None: palette only
    label: str  # the footer's word
    help: str  # the help screen's and the palette's description
    group: str = VIEW
    steering: bool = False
    show: bool = True  # in the footer
    key_display: str | None = None
    palette: str | None = None  # the palette's title; None: not in the palette
    help_line: str | None = None  # one help line for a pair of actions sharing a key (pause/resume)
    fleets: bool = False  # only for a job with several backends or a deadline (console/widgets/fleets.py)

    @property
    def name(self) -> str:
        """The action's method name, without its arguments."""
        return self.action.split("(")[0]

    def binding(self) -> Binding:
        assert self.keys is not None
        return Binding(
            self.keys,
            self.action,
            self.label,
            id=self.id,
            show=self.show,
            key_display=self.key_display,
            tooltip=self.help,
        )


ACTIONS: tuple[Action, ...] = (
    Action(
        "pause",
        "pause_job",
        "p",
        "Pause",
        "Pause the job: no new requests; those in flight finish",
        STEER,
        steering=True,
        palette="Pause job",
        help_line="Pause the job, or resume it when paused",
    ),
    Action(
        "pause",
        "resume_job",
        "p",
        "Resume",
        "Resume dispatching requests",
        STEER,
        steering=True,
        palette="Resume job",
    ),
    Action(
        "toggle-provider",
        "toggle_provider",
        "space",
        "Excl/Incl",
        "Exclude the highlighted provider, or include it again",
        STEER,
        steering=True,
        show=False,
    ),
    Action(
        "exclude",
        "exclude_provider",
        "x",
        "Exclude",
        "Exclude the highlighted provider (asks first)",
        STEER,
        steering=True,
    ),
    Action(
        "concurrency-up",
        "concurrency(1)",
        "plus",
        "Conc+",
        "Raise the configured concurrency by a step",
        STEER,
        steering=True,
        key_display="+",
    ),
    Action(
        "concurrency-down",
        "concurrency(-1)",
        "minus",
        "Conc-",
        "Lower the configured concurrency by a step",
        STEER,
        steering=True,
        key_display="-",
    ),
    Action(
        "budget",
        "set_budget",
        "b",
        "Budget",
        "Set a new dollar budget (not below spent)",
        STEER,
        steering=True,
        palette="Set budget…",
    ),
    Action(
        "backend-pause",
        "pause_backend",
        "P",
        "Backend",
        "Pause or resume one backend (the others run on)",
        STEER,
        steering=True,
        palette="Pause or resume one backend…",
        fleets=True,
    ),
    Action(
        "deadline",
        "set_deadline",
        "d",
        "Deadline",
        "Set the deadline: 12h, 90m, 06:30, or none",
        STEER,
        steering=True,
        palette="Set deadline…",
        fleets=True,
    ),
    Action(
        "stop",
        "stop_job",
        None,
        "Stop",
        "Stop the job: drain or cancel, after typing stop",
        STEER,
        steering=True,
        palette="Stop job…",
    ),
    Action(
        "freeze",
        "freeze",
        "f",
        "Freeze",
        "Stop repainting (the job keeps running)",
        palette="Freeze display",
        help_line="Freeze or thaw the display (the job runs on)",
    ),
    Action("freeze", "thaw", "f", "Thaw", "Repaint again, from the newest snapshot", palette="Thaw display"),
    Action("filter", "filter", "slash", "Filter", "Filter providers by name", key_display="/"),
    Action("sort", "cycle_sort", "s", "Sort", "Cycle the providers' sort order", show=False),
    Action("details", "details", "enter", "Details", "The highlighted provider in detail", show=False),
    Action(
        "export",
        "export",
        "e",
        "Export",
        "Write the snapshot on screen to CSV and JSON",
        show=False,
        palette="Export snapshot",
    ),
    Action("theme", "next_theme", "t", "Theme", "Next theme", show=False, palette="Next theme"),
    Action(
        "inspect",
        "inspect_hosts",
        "i",
        "Inspect",
        "Inspect the GPU hosts' datasets again",
        STEER,
        steering=True,
        show=False,
        palette="Inspect GPU hosts",
    ),
    Action(
        "sglang-start",
        "start_sglang",
        "G",
        "SGLang",
        "Start SGLang on the GPU hosts (progress in the host pane)",
        STEER,
        steering=True,
        show=False,
        palette="Start SGLang on the GPU hosts",
    ),
    Action(
        "sglang-stop",
        "stop_sglang",
        "K",
        "Stop SGLang",
        "Stop SGLang on the GPU hosts by process group (asks first)",
        STEER,
        steering=True,
        show=False,
        palette="Stop SGLang on the GPU hosts…",
    ),
    Action(
        "help",
        "help",
        "question_mark",
        "Help",
        "Every key and what it does",
        CONSOLE,
        key_display="?",
        palette="Keys",
    ),
    Action(
        "detach",
        "detach",
        "q",
        "Detach",
        "Quit the console; the job keeps running",
        CONSOLE,
        palette="Detach",
    ),
)

STEERING_ACTIONS = frozenset(a.name for a in ACTIONS if a.steering)
FLEET_ACTIONS = frozenset(a.name for a in ACTIONS if a.fleets)


def bindings() -> list[Binding]:
    """The app's key bindings."""
    return [a.binding() for a in ACTIONS if a.keys is not None]


def palette_actions() -> list[Action]:
    return [a for a in ACTIONS if a.palette is not None]
