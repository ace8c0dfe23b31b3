"""The keys that steer the job: each sends one command (engine/job/commands.py) through the source,
after a confirmation where a mistake costs (exclude, stop, SGLang's stop), and the job's answer goes
to the log and a toast; a key that cannot send says why."""

from __future__ import annotations

from typing import Any

from textual import events, on, work
from textual.widgets import Input

from regen.console.actions import STEERING_ACTIONS
from regen.console.history import LogLine, slug_of
from regen.console.messages import CommandDone
from regen.console.screens import (
    BudgetScreen,
    ConfirmScreen,
    DeadlineScreen,
    LaneScreen,
    StopScreen,
    exclude_impact,
)
from regen.console.state import ConsoleState
from regen.console.widgets.host import sglang_stop_text
from regen.engine.schema import LaneView, ProviderView, budget_lane


class SteeringKeys(ConsoleState):
    """The steering actions of console/actions.py, and the command worker they share."""

    _told_not_steer = 0.0  # when the console last said why a steering key did nothing

    def on_key(self, event: events.Key) -> None:
        """Say why a steering key does nothing, instead of staying silent."""
        if isinstance(self.focused, Input) or len(self.screen_stack) > 1:
            return
        active = self.screen.active_bindings.get(event.key)
        if active is None or active.enabled or active.binding.action.split("(")[0] not in STEERING_ACTIONS:
            return
        now = self.clock()
        if now - self._told_not_steer >= 2.0 or now < self._told_not_steer:
            self._told_not_steer = now
            self.notify(self.why_not_steer(), title="Not sent", severity="warning", timeout=4)

    def send(self, name: str, what: str, **args: Any) -> None:
        """Send a command to the job; its answer goes to the log and a toast."""
        if not self.can_steer:
            self.notify(self.why_not_steer(), title="Not sent", severity="warning")
            return
        self.event_log.add([LogLine(self.clock(), "action", f"→ {what}")])
        self._command(name, args)

    @work(group="commands", exit_on_error=False, description="Sending a command to the job")
    async def _command(self, name: str, args: dict[str, Any]) -> None:
        result = await self.source.command(name, **args)
        self.post_message(CommandDone(name, args, result["ok"], result["message"]))

    @on(CommandDone)
    def _command_done(self, message: CommandDone) -> None:
        text = message.message or ("done" if message.ok else "refused")
        if message.ok:
            self.event_log.add([LogLine(self.clock(), "action", f"✓ {message.name}: {text}")])
            self.notify(text, title=message.name)
        else:
            self.event_log.add([LogLine(self.clock(), "error", f"✗ {message.name} refused: {text}")])
            self.notify(text, title=f"{message.name} refused", severity="error")

    def action_pause_job(self) -> None:
        self.send("pause", "pause the job")

    def action_resume_job(self) -> None:
        self.send("resume", "resume the job")

    def action_inspect_hosts(self) -> None:
        self.send("inspect", "inspect the GPU hosts")

    def action_start_sglang(self) -> None:
        self.send("sglang_start", "start SGLang on the GPU hosts")

    def action_stop_sglang(self) -> None:
        """Stop SGLang on every host after a confirmation that defaults to Cancel."""
        if not self.can_steer:
            self.notify(self.why_not_steer(), title="Not sent", severity="warning")
            return
        hosts = [] if self.latest is None else [h["name"] for h in self.latest["hosts"]]

        def answered(yes: bool | None) -> None:
            if yes:
                self.send("sglang_stop", "stop SGLang on the GPU hosts")

        self.push_screen(ConfirmScreen("Stop SGLang?", sglang_stop_text(hosts), "Stop SGLang"), answered)

    def send_include(self, slug: str) -> None:
        """Route to a provider again."""
        self.send("include", f"include {slug}", provider=slug)

    def action_toggle_provider(self) -> None:
        slug = self.highlighted_slug
        if slug is None:
            self.notify("no provider highlighted", severity="warning")
            return
        provider = next((p for p in self.provider_rows() if slug_of(p) == slug), None)
        if provider is not None and self._kept_out(provider):
            return
        if provider is not None and provider["excluded"]:
            self.send_include(slug)
        else:
            self.send("exclude", f"exclude {slug}", provider=slug)

    def _kept_out(self, provider: ProviderView) -> bool:
        """A route the settings keep out cannot be steered from here; say why instead."""
        if provider["allowed"] or provider["excluded"]:
            return False
        name = provider["name"] or provider["slug"]
        self.notify(f"{name} is kept out by the settings: {provider['reason']}", severity="warning")
        return True

    def action_exclude_provider(self) -> None:
        slug = self.highlighted_slug
        if slug is None:
            self.notify("no provider highlighted", severity="warning")
            return
        self.confirm_exclude(slug)

    def confirm_exclude(self, slug: str) -> None:
        """Ask before excluding a provider, stating the impact."""
        impact = exclude_impact(self.provider_rows(), slug)
        if impact is None:
            self.notify(f"{slug} is not in the snapshot", severity="warning")
            return
        provider = next(p for p in self.provider_rows() if slug_of(p) == slug)
        if self._kept_out(provider):
            return
        if provider["excluded"]:
            self.notify(f"{impact.name} is already excluded; space includes it again", severity="warning")
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.send("exclude", f"exclude {slug}", provider=slug)

        self.push_screen(ConfirmScreen(f"Exclude {impact.name}?", impact.text, "Exclude"), answered)

    def action_concurrency(self, direction: int) -> None:
        configured = 0 if self.latest is None else budget_lane(self.latest)["concurrency"]["configured"]
        if configured <= 0:
            self.notify("the job has not reported its concurrency yet", severity="warning")
            return
        step = max(1, round(configured * self.options.concurrency_step))
        value = max(1, configured + direction * step)
        if value == configured:
            self.notify(f"concurrency is already {configured}", severity="warning")
            return
        self.send("concurrency", f"concurrency {configured} → {value}", value=value)

    def action_set_budget(self) -> None:
        money = None if self.latest is None else budget_lane(self.latest)["money"]

        def answered(value: float | None) -> None:
            if value is not None:
                self.send("budget", f"budget → ${value:.2f}", value=value)

        self.push_screen(BudgetScreen(money), answered)

    def action_pause_backend(self) -> None:
        """Pause or resume one backend, chosen from the lanes with their states; the others run on."""
        lanes = self._lanes()
        if not lanes:
            self.notify("the job has not reported its backends yet", severity="warning")
            return

        def answered(name: str | None) -> None:
            if name is None:
                return
            # The state when the choice is made, not when the chooser opened.
            lane = next((x for x in self._lanes() if x["name"] == name), None)
            if lane is None:
                self.notify(f"{name} is not in the snapshot", severity="warning")
            elif lane["state"] == "paused":
                self.send("resume", f"resume {name}", backend=name)
            else:
                self.send("pause", f"pause {name} (the others run on)", backend=name)

        self.push_screen(LaneScreen(lanes), answered)

    def _lanes(self) -> list[LaneView]:
        """The newest snapshot's lanes, in the job's order."""
        return [] if self.latest is None else self.latest["lanes"]

    def action_set_deadline(self) -> None:
        fleet = None if self.latest is None else self.latest.get("fleet")

        def answered(text: str | None) -> None:
            if text is not None:
                self.send("deadline", f"deadline → {text}", value=text)

        self.push_screen(DeadlineScreen(fleet), answered)

    def action_stop_job(self) -> None:
        """Stop the job after a typed confirmation: drain or cancel what is in flight."""
        if not self.can_steer:
            self.notify(self.why_not_steer(), title="Not sent", severity="warning")
            return
        in_flight = 0 if self.latest is None else self.latest["in_flight"]

        def answered(mode: str | None) -> None:
            if mode in ("drain", "cancel"):
                self.send("stop", f"stop the job ({mode})", cancel=mode == "cancel")

        self.push_screen(StopScreen(in_flight), answered)
