"""What both simulators do with their configs: read a TOML or JSON file with one-line errors, and
apply JSON merge patches at run time (`POST /_sim/config`)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

Config = TypeVar("Config", bound=BaseModel)


def merge_patch(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge: dicts merge recursively, null deletes a key (a top-level field then
    falls back to its default), anything else replaces."""
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_patch(out[key], value)
        else:
            out[key] = value
    return out


def patched(config: Config, patch: dict[str, Any]) -> Config:
    """A new validated config with `patch` merged in; raises pydantic.ValidationError."""
    return type(config).model_validate(merge_patch(config.model_dump(), patch))


def read_config_file(path: Path, table: str, error: type[ValueError]) -> dict[str, Any]:
    """The settings in a .toml or .json file, raising `error` with one line naming the file.

    One file may configure several simulators: when its top level holds only simulator tables
    (`[openrouter]`, `[sglang]`), `table` is this simulator's.
    """
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise error(f"{path}: cannot read ({exc.strerror or exc})") from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            data: Any = tomllib.loads(raw.decode("utf-8"))
        elif suffix == ".json":
            data = json.loads(raw.decode("utf-8"))
        else:
            raise error(f"{path}: unsupported config type {suffix!r} (use .toml or .json)")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path}: not valid {suffix[1:].upper()}: {exc}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: the top level must be a table/object")
    chosen = data.get(table)
    if isinstance(chosen, dict) and set(data) <= {"openrouter", "sglang"}:
        return chosen
    return data
