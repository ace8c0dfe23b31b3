"""Loading the settings: a TOML file, then `REGEN_` environment variables, then `OPENROUTER_API_KEY`.

Every problem is one line naming the key and where its value came from (the file, an environment
variable, the defaults); relative paths in the file are relative to the file; what `regen pull`
brought is used where the settings leave it open (engine/config/workspace.py).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import SecretStr, ValidationError

from regen.engine.config.needs import need_problems
from regen.engine.config.settings import ENV_PREFIX, Settings
from regen.engine.config.workspace import use_workspace
from regen.engine.errors import UsageError

DEFAULT_SETTINGS_FILE = Path("settings.toml")
KEY_ENV = "OPENROUTER_API_KEY"


class SettingsError(UsageError, ValueError):
    """Settings that cannot be used; `problems` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def _key_path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _env_name(key: str) -> str:
    return ENV_PREFIX + key.replace(".", "__").upper()


def load_settings(path: Path | None = None, command: str = "run") -> Settings:
    """Load settings from `path` (or ./settings.toml when present, else defaults) and the environment,
    checked for what `command` needs of them (engine/config/needs.py).

    Raises SettingsError with one line per problem, each naming the key and where it came from.
    """
    env = os.environ
    source = path
    if source is None and DEFAULT_SETTINGS_FILE.is_file():
        source = DEFAULT_SETTINGS_FILE
    data: dict[str, Any] = {}
    if source is not None:
        try:
            with open(source, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise SettingsError([f"{source}: settings file not found"]) from None
        except IsADirectoryError:
            raise SettingsError([f"{source}: is a folder, not a settings file"]) from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError([f"{source}: not valid TOML: {exc}"]) from None
        except UnicodeDecodeError as exc:
            raise SettingsError([f"{source}: not valid UTF-8 (byte {exc.start})"]) from None
        except RecursionError:
            raise SettingsError([f"{source}: not valid TOML: nested too deep"]) from None
        except OSError as exc:
            raise SettingsError([f"{source}: cannot read: {exc.strerror}"]) from None
    where = str(source) if source is not None else "built-in defaults"
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_input=False, include_url=False):
            key = _key_path(err["loc"])
            origin = f"environment {_env_name(key)}" if _env_name(key) in env else where
            # A validator's own message, without pydantic's "Value error, " in front of it.
            message = err["msg"].removeprefix("Value error, ") if err["type"] == "value_error" else err["msg"]
            problems.append(f"{origin}: {key}: {message}")
        raise SettingsError(problems) from None
    if settings.openrouter.api_key is None and env.get(KEY_ENV):
        settings.openrouter.api_key = SecretStr(env[KEY_ENV])
    base = source.parent if source is not None else Path.cwd()
    settings.job.datasets = [_resolve(base, p) for p in settings.job.datasets]
    settings.job.dataset_roots = [_resolve(base, p) for p in settings.job.dataset_roots]
    settings.job.run_dir = _resolve(base, settings.job.run_dir)
    if settings.tokenizer.path is not None:
        settings.tokenizer.path = _resolve(base, settings.tokenizer.path)
    settings.console.theme_dirs = [_resolve(base, p) for p in settings.console.theme_dirs]
    if settings.console.export_dir is not None:
        settings.console.export_dir = _resolve(base, settings.console.export_dir)
    settings.workspace = _resolve(base, settings.workspace)
    for host in settings.hosts:
        host.key_files = [_resolve(base, p) for p in host.key_files]
        if host.known_hosts is not None:
            host.known_hosts = _resolve(base, host.known_hosts)
    for cluster in settings.clusters:
        cluster.work_dir = _resolve(base, cluster.work_dir)
    if settings.tokenizer.path is None and not settings.hosts and settings.clusters:
        # A cluster's model folder is on the filesystem this machine shares with the nodes
        # (docs/clusters.md): its tokenizer files are read where they are.
        settings.tokenizer.path = Path(settings.clusters[0].model_path)
    use_workspace(settings)
    # After the workspace: a tokenizer `regen pull` brought is as good as one named in the file.
    problems = need_problems(settings, command)
    if problems:
        raise SettingsError([f"{where}: {problem}" for problem in problems])
    return settings


def _resolve(base: Path, path: Path) -> Path:
    """Relative paths in a settings file are relative to that file, not to the working folder."""
    path = path.expanduser()
    return path if path.is_absolute() else (base / path)
