"""What the console holds and shows: the job's newest snapshot and the one on display, the hello,
whether it may steer; the app's base (console/app.py `RegenApp`, console/steering.py `SteeringKeys`)."""

from __future__ import annotations

from collections.abc import Callable

from textual.app import App
from textual.reactive import reactive

from regen.console.history import History
from regen.console.options import ConsoleOptions
from regen.console.source import JobSource
from regen.console.widgets.fleets import shows_fleets
from regen.console.widgets.log import EventLog
from regen.console.widgets.providers import ProvidersPane, ProvidersTable
from regen.console.widgets.status import StatusStrip
from regen.engine.schema import Hello, ProviderView, Snapshot, budget_lane

LIVE_STATES = ("RUNNING", "PAUSED")


class ConsoleState(App[str]):
    """The console's state over a `JobSource`, and the widgets every part of it writes to."""

    # Neither repaints: an App reactive that repaints redraws the whole screen; the header shows both.
    job_state: reactive[str] = reactive("STARTING", repaint=False, bindings=True)
    """The job's state word from the newest snapshot; the footer offers what applies to it."""
    frozen: reactive[bool] = reactive(False, repaint=False)
    """Whether the display is frozen (snapshots still arrive and are kept); see `RegenApp.watch_frozen`."""

    def __init__(self, source: JobSource, options: ConsoleOptions, clock: Callable[[], float]) -> None:
        super().__init__()
        self.source = source
        self.options = options
        self.clock = clock
        self.readonly = bool(source.readonly)
        self.hello: Hello | None = None  # till the job answers
        self.history = History(points=self.options.history_points)
        self.latest: Snapshot | None = None
        self.latest_at: float | None = None
        self.displayed: Snapshot | None = None
        self.displayed_at: float | None = None
        self.ended: str | None = None

    # ------------------------------------------------------------------------------ widgets

    @property
    def _shutting_down(self) -> bool:
        """True once the app is closing: its widgets are being removed, so a message or timer that
        arrives now (a snapshot, the freshness tick) has nothing left to paint."""
        return self._closing or self._closed or not self.query(StatusStrip)

    @property
    def status(self) -> StatusStrip:
        return self.query_one(StatusStrip)

    @property
    def providers_pane(self) -> ProvidersPane:
        return self.query_one(ProvidersPane)

    @property
    def event_log(self) -> EventLog:
        return self.query_one(EventLog)

    def provider_rows(self) -> list[ProviderView]:
        """Providers of the snapshot on screen: the routes of its budget lane (engine/schema.py budget_lane)."""
        return [] if self.displayed is None else list(budget_lane(self.displayed)["providers"])

    @property
    def highlighted_slug(self) -> str | None:
        return self.query_one(ProvidersTable).highlighted_slug

    # ----------------------------------------------------------------------------- steering

    @property
    def can_steer(self) -> bool:
        """Whether commands may be sent now."""
        return (
            not self.readonly
            and self.ended is None
            and self.hello is not None
            and self.job_state in LIVE_STATES
        )

    def why_not_steer(self) -> str:
        """Why a steering key does nothing now."""
        if self.readonly:
            return "read-only console: it watches; attach without --readonly to steer"
        if self.ended is not None:
            return f"not connected to the job ({self.ended})"
        if self.hello is None:
            return "not connected to the job yet"
        return f"the job is {self.job_state}: nothing to steer"

    @property
    def supports_exclude(self) -> bool:
        """Whether the routes the providers pane shows can be excluded (a capability their lane carries)."""
        snap = self.displayed or self.latest
        return True if snap is None else budget_lane(snap)["supports_exclude"]

    @property
    def shows_fleets(self) -> bool:
        """Whether the job runs on several backends or to a deadline: the fleets pane and its keys."""
        return shows_fleets(self.displayed or self.latest)
