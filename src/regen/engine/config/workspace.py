"""The local workspace that `regen pull` fills, and how a run picks it up without further settings.

`<workspace>/datasets/<name>/prompts.jsonl` holds pulled datasets and `<workspace>/tokenizer/` the
model's tokenizer files (docs/gpu-host.md). A run uses them when the settings name nothing else:
engine/config/loading.py calls `use_workspace` once the settings are read.
"""

from __future__ import annotations

from pathlib import Path

from regen.engine.config.settings import Settings

PROMPTS_FILE = "prompts.jsonl"
DATASETS_DIR = "datasets"
TOKENIZER_DIR = "tokenizer"


def datasets_dir(workspace: Path) -> Path:
    return workspace / DATASETS_DIR


def tokenizer_dir(workspace: Path) -> Path:
    return workspace / TOKENIZER_DIR


def holds_datasets(folder: Path) -> bool:
    """Whether `folder` has a subfolder holding prompts.jsonl (what a datasets root needs)."""
    try:
        return any(p.is_dir() and (p / PROMPTS_FILE).is_file() for p in folder.iterdir())
    except OSError:
        return False


def use_workspace(settings: Settings) -> None:
    """Point the job at what `regen pull` brought, where the settings leave it open.

    With neither job.datasets nor job.dataset_roots set and datasets under
    `<workspace>/datasets`, that folder becomes the one dataset root; with tokenizer.path unset and
    a `<workspace>/tokenizer` folder, that folder is the tokenizer. Settings given explicitly always win.
    """
    job = settings.job
    pulled = datasets_dir(settings.workspace)
    if not job.datasets and not job.dataset_roots and holds_datasets(pulled):
        job.dataset_roots = [pulled]
    tokenizer = tokenizer_dir(settings.workspace)
    if settings.tokenizer.path is None and tokenizer.is_dir():
        settings.tokenizer.path = tokenizer
