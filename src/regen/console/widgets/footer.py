"""The footer: Textual's, but a change of what the keys say updates the keys in place."""

from __future__ import annotations

from dataclasses import dataclass

from textual.screen import Screen
from textual.widgets import Footer
from textual.widgets._footer import FooterKey


@dataclass(frozen=True, slots=True)
class KeyLook:
    """What one footer key shows: the same fields Textual's `Footer.compose` gives a `FooterKey`."""

    key: str
    key_display: str
    description: str
    action: str
    enabled: bool
    tooltip: str


class RegenFooter(Footer):
    """A `Footer` that patches its keys when only their words or states change.

    Textual's footer recomposes on every bindings change (freeze/thaw, pause/resume, a job that
    stops): it mounts a new key per binding and lays the footer out twice. In textual 8.2.8 each
    replaced key also stays referenced by the footer's `compact` data binding, so a long session
    piles up dead widgets that every full garbage collection walks, and the pauses grow. When the
    same keys stay in the same order, this footer sets their description, action, tooltip and
    disabled state instead; anything else (binding groups, keys added or removed) recomposes.
    """

    def bindings_changed(self, screen: Screen[object]) -> None:
        if self._bindings_ready and screen.app.app_focus and self.is_attached and screen is self.screen:
            wanted = self._wanted_keys(screen)
            if wanted is not None and self._patch(wanted):
                return
        super().bindings_changed(screen)

    def _wanted_keys(self, screen: Screen[object]) -> list[KeyLook] | None:
        """The keys `Footer.compose` would yield now, palette key last; None when it would group some."""
        active = screen.active_bindings
        first_per_action: dict[str, KeyLook] = {}
        for _node, binding, enabled, tooltip in active.values():
            if not binding.show:
                continue
            if binding.group is not None:
                return None
            first_per_action.setdefault(
                binding.action,
                KeyLook(
                    binding.key,
                    self.app.get_key_display(binding),
                    binding.description,
                    binding.action,
                    enabled,
                    tooltip,
                ),
            )
        wanted = list(first_per_action.values())
        if self.show_command_palette and self.app.ENABLE_COMMAND_PALETTE:
            palette = active.get(self.app.COMMAND_PALETTE_BINDING)
            if palette is not None:
                _node, binding, enabled, tooltip = palette
                wanted.append(
                    KeyLook(
                        binding.key,
                        self.app.get_key_display(binding),
                        binding.description,
                        binding.action,
                        enabled,
                        binding.tooltip or binding.description,
                    )
                )
        return wanted

    def _patch(self, wanted: list[KeyLook]) -> bool:
        """Update the keys on screen to `wanted`; False (nothing touched) when they are other keys."""
        keys = list(self.children)
        if len(keys) != len(wanted) or not all(
            isinstance(key, FooterKey) and key.key == look.key and key.key_display == look.key_display
            for key, look in zip(keys, wanted, strict=True)
        ):
            return False
        for key, look in zip(keys, wanted, strict=True):
            assert isinstance(key, FooterKey)
            disabled = not look.enabled
            if (key.description, key.action, key._disabled) == (look.description, look.action, disabled):
                continue
            resized = len(key.description) != len(look.description)
            key.description = look.description
            key.action = look.action
            key._disabled = disabled
            key.set_class(disabled, "-disabled")
            key.tooltip = look.tooltip or None
            key.refresh(layout=resized)
        return True
