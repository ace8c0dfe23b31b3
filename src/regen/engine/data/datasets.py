"""Datasets of chat prompts: the folder, its files, finding datasets, and a prompt's identity.

A dataset is a folder holding ``prompts.jsonl``; its name is the folder name. One JSON object per
line in OpenAI chat format (docs/data-contract.md §1). A prompt's identity is ``(dataset, line)`` with a
0-based line number, guarded by the sha256 of its canonical messages (docs/data-contract.md §2). Line
numbers are 0-based everywhere regen shows them, so ``B3 line 1234`` is the prompt ``B3-00001234``.

The parts that read a dataset build on this one: data/lines.py reads a file's lines in bounded
memory, data/validate.py holds a line's rules, data/scan.py makes one pass over a dataset with both.
This module, lines.py and validate.py depend on the standard library only (orjson is used when
importable): they are shipped to the GPU host and run there (engine/host/remote.py ``MODULES``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.engine.errors import UsageError

__all__ = [
    "PROMPTS_FILE",
    "RESULTS_FILE",
    "Dataset",
    "DatasetError",
    "Prompt",
    "canonical_json",
    "canonical_sha256",
    "discover",
    "name_problem",
]

PROMPTS_FILE = "prompts.jsonl"
RESULTS_FILE = "raw_responses.jsonl"
# '#' separates the prompt id from the attempt number in request ids (docs/data-contract.md §2).
_BAD_NAME = re.compile(r"[\s#\x00-\x1f\x7f]")


class DatasetError(UsageError, ValueError):
    """A dataset cannot be used as given; the message is one line and names the path."""


# ---------------------------------------------------------------------------------------------
# Datasets and discovery


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    folder: Path

    @property
    def prompts_path(self) -> Path:
        return self.folder / PROMPTS_FILE

    @property
    def results_path(self) -> Path:
        return self.folder / RESULTS_FILE


def _dataset_at(folder: Path) -> Dataset:
    if not folder.exists():
        raise DatasetError(f"{folder}: dataset folder does not exist")
    if not folder.is_dir():
        raise DatasetError(f"{folder}: not a folder (a dataset is a folder holding {PROMPTS_FILE})")
    if not (folder / PROMPTS_FILE).is_file():
        raise DatasetError(f"{folder}: no {PROMPTS_FILE} in this folder")
    # Path(".").name is empty; the dataset is still named after the folder it really is.
    name = folder.name or folder.resolve().name
    problem = name_problem(name)
    if problem is not None:
        raise DatasetError(f"{folder}: {problem}")
    return Dataset(name=name, folder=folder)


def name_problem(name: str) -> str | None:
    """Why a folder name cannot name a dataset (request ids are built from it), or None."""
    if not name or name.startswith(".") or _BAD_NAME.search(name):
        return f"dataset name {name!r} is not usable (no whitespace, control characters, '#' or leading '.')"
    return None


def discover(
    folders: Sequence[Path],
    roots: Sequence[Path],
    only: Collection[str] | None = None,
) -> list[Dataset]:
    """Datasets named directly (``folders``, in order) then found under ``roots``.

    Each root contributes its immediate subfolders that hold a ``prompts.jsonl``, sorted by name.
    ``only`` keeps just the named datasets; naming one that was not found is an error, as is a
    root with no datasets at all (almost always a wrong path) or two different folders with the
    same name (results would be keyed ambiguously).
    """
    found: list[Dataset] = []
    for folder in folders:
        found.append(_dataset_at(Path(folder)))
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            what = "does not exist" if not root.exists() else "is not a folder"
            raise DatasetError(f"{root}: datasets root {what}")
        subs = sorted(
            (
                p
                for p in root.iterdir()
                if p.is_dir() and not p.name.startswith(".") and (p / PROMPTS_FILE).is_file()
            ),
            key=lambda p: p.name,
        )
        if not subs:
            raise DatasetError(f"{root}: no dataset folders (subfolders holding {PROMPTS_FILE})")
        found.extend(_dataset_at(p) for p in subs)

    by_name: dict[str, Dataset] = {}
    result: list[Dataset] = []
    for ds in found:
        seen = by_name.get(ds.name)
        if seen is None:
            by_name[ds.name] = ds
            result.append(ds)
        elif seen.folder.resolve() != ds.folder.resolve():
            raise DatasetError(f"{ds.folder}: dataset name {ds.name!r} is also used by {seen.folder}")
        # The same folder reached twice (named and under a root) is one dataset.

    if only is not None:
        wanted = set(only)
        unknown = sorted(wanted - by_name.keys())
        if unknown:
            known = ", ".join(sorted(by_name)) or "none"
            raise DatasetError(f"unknown dataset {', '.join(unknown)} (found: {known})")
        result = [ds for ds in result if ds.name in wanted]
    return result


# ---------------------------------------------------------------------------------------------
# Prompts and canonical hashing


@dataclass(slots=True)
class Prompt:
    dataset: str
    line: int
    sha256: str
    messages: list[dict[str, Any]]
    source_id: str | None = None
    meta: dict[str, Any] | None = None

    @property
    def id(self) -> str:
        return f"{self.dataset}-{self.line:08d}"

    @property
    def request_messages(self) -> list[dict[str, Any]]:
        """The messages exactly as the line holds them; this is what goes to the backend, so
        ``sha256`` always describes what was sent."""
        return self.messages


def canonical_json(messages: Any) -> bytes:
    """The canonical bytes of docs/data-contract.md §2, by its defining ``json.dumps`` call."""
    return json.dumps(messages, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")


def canonical_sha256(messages: Any) -> str:
    """Hex sha256 of the canonical messages (docs/data-contract.md §2); the reference definition."""
    return hashlib.sha256(canonical_json(messages)).hexdigest()
