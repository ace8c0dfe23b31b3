"""What each command needs of the settings beyond their shape, defined once (docs/gpu-host.md,
"Settings each command needs").

The settings' shape (engine/config/settings.py) holds for every command. What one backend needs of
other sections holds only for the commands that use it: `regen inspect` and `regen pull` exist to
fetch what `regen run` will need, so they must not ask for it first. `COMMAND_NEEDS` names each
command's needs; engine/config/loading.py checks them when a command loads its settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

from regen.engine.config.settings import Settings


class Need(Enum):
    """One thing a command needs of the settings when SGLang is one of the job's backends."""

    SERVERS = "servers"
    """SGLang's servers: sglang.urls, or [[hosts]] to reach them through."""
    TOKENIZER = "tokenizer"
    """The model's tokenizer: tokenizer.path (or the workspace's pulled one), or a [[hosts]] model
    folder that `regen run` fetches it from (engine/host/transfer.py `fetch_tokenizer`)."""


_RUN = frozenset({Need.SERVERS, Need.TOKENIZER})

COMMAND_NEEDS: Mapping[str, frozenset[Need]] = {
    "run": _RUN,
    "job-process": _RUN,
    "attach": frozenset(),
    "stop": frozenset(),
    "catalog": frozenset(),
    "inspect": frozenset(),
    "pull": frozenset(),
    "push": frozenset(),
    "sglang": frozenset(),
    "verify": frozenset(),
    "export": frozenset(),
    "quarantine": frozenset(),
    "audit": frozenset(),
    "report": frozenset(),
}


def tokenizer_hosts(settings: Settings) -> list[str]:
    """The [[hosts]] whose model folder a run may fetch the tokenizer from, in the settings' order."""
    return [h.name for h in settings.hosts if h.model_path]


def need_problems(settings: Settings, command: str) -> list[str]:
    """What `command` needs and the settings lack, one line per problem (key first)."""
    needs = COMMAND_NEEDS[command]
    if "sglang" not in settings.job.chosen_backends:
        return []
    chosen = 'job.backend is "sglang"' if settings.job.backends is None else 'job.backends includes "sglang"'
    problems = []
    if Need.SERVERS in needs and not settings.sglang.urls and not settings.hosts and not settings.clusters:
        # With [[hosts]] and no urls, the run reaches each host's server through a tunnel of its own.
        problems.append(
            f"sglang.urls: empty and no [[hosts]], but {chosen}: set urls to the server's URL, "
            'e.g. urls = ["http://127.0.0.1:30000"], or add the GPU hosts as [[hosts]] tables '
            "or a cluster as a [[clusters]] table"
        )
    if Need.TOKENIZER in needs and settings.tokenizer.path is None and not tokenizer_hosts(settings):
        problems.append(
            f"tokenizer.path: empty and no [[hosts]] model_path to fetch it from, but {chosen}: the prompts' "
            "token ids are rendered locally, so set tokenizer.path to the model's tokenizer folder, or add "
            "the GPU host as a [[hosts]] table with model_path and run regen pull"
        )
    return problems
