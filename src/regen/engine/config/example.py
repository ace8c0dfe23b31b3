"""settings.example.toml: every setting, its docstring as a comment, its default value.

Written from the models themselves (engine/config/settings.py), so the file and the code never drift
apart; tests/engine/config/test_settings.py checks the file is current and says how to regenerate it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic_core import PydanticUndefinedType

from regen.engine.config.settings import ClusterSettings, HostSettings, Settings


def _toml_value(value: Any) -> str:
    if isinstance(value, SecretStr):
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Path | str):
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def example_toml() -> str:
    """settings.example.toml: every setting, its docstring as a comment, its default value."""
    lines = [
        "# regen settings: every setting with its default. Copy to settings.toml and edit.",
        "# Environment variables override the file: REGEN_<SECTION>__<KEY>, e.g. REGEN_JOB__CONCURRENCY=500.",
        "# The API key is best given as OPENROUTER_API_KEY, never committed.",
        "# Relative paths are relative to the settings file.",
    ]

    def section(title: str, model: type[BaseModel], defaults: BaseModel) -> None:
        lines.append("")
        lines.append(f"[{title}]")
        doc = (model.__doc__ or "").strip()
        if doc:
            lines.append(f"# {doc}")
        nested = []
        for name, info in model.model_fields.items():
            value = getattr(defaults, name)
            if isinstance(value, BaseModel):
                nested.append((f"{title}.{name}", type(value), value))
                continue
            lines.append("")
            for doc_line in (info.description or "").splitlines():
                lines.append(f"# {doc_line}".rstrip())
            if value is None:
                lines.append(f"# {name} =")
            else:
                lines.append(f"{name} = {_toml_value(value)}")
        for sub in nested:
            section(*sub)

    def example_table(title: str, model: type[BaseModel]) -> None:
        # A list of tables is empty by default, so its keys are shown as a commented example.
        lines.append("")
        doc = (model.__doc__ or "").strip()
        if doc:
            lines.append(f"# {doc}")
        lines.append(
            f"# One table per {_TABLE_ONE[title]}: copy the block and remove the first '# ' of each line."
        )
        lines.append(f"# [[{title}]]")
        for name, info in model.model_fields.items():
            lines.append("#")
            for doc_line in (info.description or "").splitlines():
                lines.append(f"# # {doc_line}".rstrip())
            examples = _TABLE_EXAMPLES.get(title, {})
            example = examples[name] if name in examples else info.get_default(call_default_factory=True)
            if example is None or isinstance(example, PydanticUndefinedType):
                lines.append(f"# {name} =")
            else:
                lines.append(f"# {name} = {_toml_value(example)}")

    defaults = Settings.model_construct()
    tables = []
    # Top-level keys must come before the first [section] in TOML.
    for name, info in Settings.model_fields.items():
        value = getattr(defaults, name)
        if isinstance(value, BaseModel | list):
            continue
        lines.append("")
        for doc_line in (info.description or "").splitlines():
            lines.append(f"# {doc_line}".rstrip())
        lines.append(f"{name} = {_toml_value(value)}")
    for name in Settings.model_fields:
        value = getattr(defaults, name)
        if isinstance(value, BaseModel):
            section(name, type(value), value)
        elif isinstance(value, list):
            tables.append(name)
    for name in tables:
        example_table(name, _LIST_TABLES[name])
    return "\n".join(lines) + "\n"


# The model of each list-of-tables setting, and example values for its commented example.
_LIST_TABLES: dict[str, type[BaseModel]] = {"hosts": HostSettings, "clusters": ClusterSettings}
_TABLE_ONE = {"hosts": "host", "clusters": "cluster"}
_TABLE_EXAMPLES: dict[str, dict[str, Any]] = {
    "hosts": {
        "name": "gpu1",
        "address": "gpu1.example.org",
        "user": "ubuntu",
        "data_root": "~/prepared",
        "model_path": "/models/Kimi-K2.5",
    },
    "clusters": {
        "name": "lab",
        "partition": "gpu",
        "nodes": 4,
        "account": "drafters",
        "model_path": "/shared/models/Kimi-K2.5",
        "work_dir": "/shared/regen",
    },
}
