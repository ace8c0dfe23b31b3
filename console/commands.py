"""The command palette's regen commands: stop (behind a typed confirmation), steering, view."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

if TYPE_CHECKING:
    from console.app import RegenApp


class RegenCommands(Provider):
    """Commands over the job and the view; steering ones only when the console may steer."""

    def _commands(self) -> list[tuple[str, str, Callable[[], object]]]:
        app = cast("RegenApp", self.app)
        commands: list[tuple[str, str, Callable[[], object]]] = []
        if app.can_steer:
            commands.append(("Stop job…", "drain or cancel, after typing stop", app.action_stop_job))
            if app.job_state == "RUNNING":
                commands.append(("Pause job", "no new requests; in flight finish", app.action_pause_job))
            if app.job_state == "PAUSED":
                commands.append(("Resume job", "dispatch again", app.action_resume_job))
            commands.append(("Set budget…", "a new dollar budget", app.action_set_budget))
            for provider in app.provider_rows():
                slug = str(provider.get("slug") or provider.get("name"))
                name = str(provider.get("name") or slug)
                if provider.get("excluded"):
                    commands.append((f"Include provider {name}", slug, partial(app.send_include, slug)))
                else:
                    commands.append((f"Exclude provider {name}…", slug, partial(app.confirm_exclude, slug)))
        commands += [
            ("Export snapshot", "CSV and JSON files", app.action_export),
            (
                "Freeze display" if not app.frozen else "Thaw display",
                "stop or restart repainting",
                app.action_toggle_freeze,
            ),
            ("Next theme", "cycle the loaded themes", app.action_next_theme),
            ("Keys", "every key and what it does", app.action_help),
            ("Detach", "quit the console; the job keeps running", app.action_detach),
        ]
        return commands

    async def discover(self) -> Hits:
        for title, help_text, callback in self._commands():
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, callback in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_text)
