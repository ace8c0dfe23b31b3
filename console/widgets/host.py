"""The GPU host pane: SGLang host metrics belong here; until a host is configured it says so."""

from __future__ import annotations

from typing import Any

from textual.widgets import Static

NO_HOST = "no GPU host configured"


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
        super().__init__(NO_HOST, id=id, markup=False)
        self.border_title = "Host"
        self.text = NO_HOST

    def show(self, snap: dict[str, Any]) -> None:
        """Repaint from the snapshot's "host" section, when there is one (and only when it changed)."""
        host = snap.get("host")
        if not isinstance(host, dict) or not host:
            text = NO_HOST
        else:
            lines = [
                f"{key}: {value}" for key, value in sorted(host.items()) if not isinstance(value, dict | list)
            ]
            text = "\n".join(lines) or "GPU host: no metrics yet"
        if text != self.text:
            self.text = text
            self.update(text)
