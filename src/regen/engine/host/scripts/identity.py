"""A model folder's identity by content, taken on the host: what makes two hosts' models one model.

A path says nothing about the weights: two hosts can hold different files at one path and the same
files at different paths (docs/gpu-host.md, "One model"). The identity is a list of items, each a
name and what the host found: the sha256 of config.json, generation_config.json, the tokenizer
files and the weights' index files, the size of each weight file (hashing ~600 GB is not an
option), and the sglang version installed. The job adds the weight version it launches with
(`with_weight_version`). The digest is one sha256 over the items, so equal items are one model
whatever the folder's path.

Runs on the host (standard library only), shipped on stdin beside probe.py; the engine imports the
same module for `digest` and `first_difference`, so both sides keep one rule.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from regen.engine.host.scripts import probe

# Content files first, in this order: the first item that differs is the one an operator is told.
CONFIG_FILES = ("config.json", "generation_config.json")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin")
SGLANG_ITEM = "sglang version"
WEIGHT_VERSION_ITEM = "weight version"

Item = list[str]  # [name, what the host found]: "sha256:<hex>", "bytes:<n>" or a version


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def survey(model_path: str) -> dict[str, Any]:
    """``{"path", "exists", "items", "error"}`` for the model folder at ``model_path``."""
    folder = probe.expand(model_path)
    if not os.path.isdir(folder):
        return {"path": folder, "exists": False, "items": [], "error": "does not exist"}
    items: list[Item] = []
    content = [*CONFIG_FILES]
    for name in (*probe.TOKENIZER_FILES, *probe.auto_map_files(folder), *INDEX_FILES):
        if name not in content:
            content.append(name)
    try:
        for name in content:
            full = os.path.join(folder, name)
            if os.path.isfile(full):
                items.append([name, _sha256(full)])
        weights = []
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.endswith(WEIGHT_SUFFIXES) and entry.is_file():
                    weights.append([entry.name, f"bytes:{entry.stat().st_size}"])
        items.extend(sorted(weights))
    except OSError as exc:
        return {"path": folder, "exists": True, "items": items, "error": exc.strerror or str(exc)}
    # Unknown when not installed here: the server's own version is checked when the job reaches it.
    with contextlib.suppress(metadata.PackageNotFoundError):
        items.append([SGLANG_ITEM, metadata.version("sglang")])
    return {"path": folder, "exists": True, "items": items, "error": None}


def with_weight_version(items: Sequence[Sequence[str]], weight_version: str | None) -> list[Item]:
    """The items and the weight version the servers are launched with, where it is known."""
    out = [list(item) for item in items if item[0] != WEIGHT_VERSION_ITEM]
    if weight_version is not None:
        out.append([WEIGHT_VERSION_ITEM, weight_version])
    return out


def digest(items: Sequence[Sequence[str]]) -> str:
    """One sha256 over the items, in a canonical order: equal items, equal digest."""
    canonical = json.dumps(sorted([str(n), str(v)] for n, v in items), separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def first_difference(
    one: Sequence[Sequence[str]], other: Sequence[Sequence[str]]
) -> tuple[str, str | None, str | None] | None:
    """The first item (in ``one``'s order, then ``other``'s) whose value differs, with both values
    (None where a side has no such file); None when the two are one model."""
    mine = {str(n): str(v) for n, v in one}
    theirs = {str(n): str(v) for n, v in other}
    for name in [*mine, *(n for n in theirs if n not in mine)]:
        if mine.get(name) != theirs.get(name):
            return name, mine.get(name), theirs.get(name)
    return None
