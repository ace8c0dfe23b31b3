"""The backends behind the engine's contract (engine/backends/base.py, docs/architecture.md).

`make_backend` imports only the backend the settings choose, so a job on OpenRouter never loads
the SGLang client or asyncssh, and the other way round; `make_backends` makes each of a job's
backends (`job.backends`, else `job.backend`) the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from regen.engine.backends.base import Backend
    from regen.engine.config.settings import Settings
    from regen.engine.host.monitor import HostMonitor


def make_backends(settings: Settings, hosts: HostMonitor | None = None) -> list[Backend]:
    """The job's backends, in the order of `job.backends` (one lane each, engine/job/lanes.py)."""
    return [make_backend(settings, hosts, name) for name in settings.job.chosen_backends]


def make_backend(settings: Settings, hosts: HostMonitor | None = None, name: str | None = None) -> Backend:
    """The backend named (default: job.backend). `hosts` is the job's watch over its GPU hosts:
    without `sglang.urls`, the SGLang backend reaches their servers over its SSH connections."""
    if (settings.job.backend if name is None else name) == "sglang":
        from regen.engine.backends.sglang.backend import SGLangBackend

        return SGLangBackend(settings, hosts=hosts)
    from regen.engine.backends.openrouter.backend import OpenRouterBackend

    return OpenRouterBackend(settings)
