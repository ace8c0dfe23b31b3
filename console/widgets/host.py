"""The GPU host pane: SGLang host metrics belong here; until a host is configured it says so."""

from __future__ import annotations

from typing import Any

from textual.widgets import Static


class HostPane(Static):
    """Shows the GPU host's state when the job reports one, else that there is none."""

    DEFAULT_CSS = """
    HostPane {
        padding: 0 1;
        background: $surface;
        color: $text-muted;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("no GPU host configured", id=id, markup=False)
        self.border_title = "Host"

    def show(self, snap: dict[str, Any]) -> None:
        """Repaint from the snapshot's "host" section, when there is one."""
        host = snap.get("host")
        if not isinstance(host, dict) or not host:
            self.update("no GPU host configured")
            return
        lines = [
            f"{key}: {value}" for key, value in sorted(host.items()) if not isinstance(value, dict | list)
        ]
        self.update("\n".join(lines) or "GPU host: no metrics yet")
