"""JSON merge patches of a simulator's config at run time (`POST /_sim/config`), for both simulators."""

from __future__ import annotations

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
