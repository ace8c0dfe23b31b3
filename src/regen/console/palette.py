"""The command palette's regen commands: the registry's palette actions (console/actions.py) and one
include or exclude per provider."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

from regen.console.actions import palette_actions
from regen.console.history import slug_of

if TYPE_CHECKING:
    from regen.console.app import RegenApp


class RegenCommands(Provider):
    """Commands over the job and the view; steering ones only when the console may steer."""

    def _commands(self) -> list[tuple[str, str, Callable[[], object]]]:
        app = cast("RegenApp", self.app)
        commands: list[tuple[str, str, Callable[[], object]]] = []
        for action in palette_actions():
            # The same rule as the keys: what the footer would offer now, the palette offers.
            if app.check_action(action.name, ()) is True:
                commands.append((str(action.palette), action.help, getattr(app, f"action_{action.name}")))
        if app.can_steer and app.supports_exclude:
            for provider in app.provider_rows():
                if not provider["allowed"] and not provider["excluded"]:
                    continue  # kept out by the settings: nothing to steer
                slug = slug_of(provider)
                name = provider["name"] or slug
                if provider["excluded"]:
                    commands.append((f"Include provider {name}", slug, partial(app.send_include, slug)))
                else:
                    commands.append((f"Exclude provider {name}…", slug, partial(app.confirm_exclude, slug)))
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
