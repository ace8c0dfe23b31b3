"""The real sglang package, read from its wheel as a zip: never installed, never imported whole.

The wheel is fetched once with `pip download --no-deps` into a cache folder outside the repository
(`$REGEN_SGLANG_WHEELS`, else `$XDG_CACHE_HOME/regen/sglang-wheels`, else `~/.cache/...`) and read
from there; only the network's absence skips the tests that need it. What is read:

- the launch flags, by parsing the sources with `ast`: 0.5.23 declares them as annotated fields of
  the `arg_groups/fields` records (`A[type, "help"]` or `A[type, Arg(aliases=..., cli_name=...)]`,
  turned into flags by `arg_groups/arg_utils.py` `add_cli_args_from_dataclass`), plus a few
  `parser.add_argument` calls; 0.5.9 has only the calls. Each is kept as one action's option
  strings, so argparse itself can be asked what an abbreviation means;
- the log messages: every string literal and f-string of the package, as the literal parts between
  its placeholders;
- the `/generate` JSON contract: `sglang/api/v1/api_types.py` executed on its own (it needs only
  `msgspec.Struct`, stubbed when msgspec is absent).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import types
import warnings
import zipfile
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

__all__ = ["RealSGLang", "fetch_wheel", "message_can_hold", "source_says"]

# The shape of the messages kept beside a wheel; a change of `_literal_parts` bumps it.
_MESSAGES_FORMAT = 2
# pip's words when it could not reach the index at all.
_OFFLINE = (
    "Failed to establish a new connection",
    "Network is unreachable",
    "Temporary failure in name resolution",
    "NewConnectionError",
    "ConnectTimeoutError",
    "ProxyError",
)

# The release regen's docs follow, and the older one whose spellings regen also handles.
CURRENT = "0.5.23"
OLDER = "0.5.9"


def _index_reachable() -> bool:
    """Whether the package index pip uses answers a TCP connection at all."""
    url = urlsplit(os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple")
    if url.scheme == "file":
        return True
    try:
        socket.create_connection(
            (url.hostname or "pypi.org", url.port or (443 if url.scheme == "https" else 80)), 10
        ).close()
    except OSError:
        return False
    return True


def cache_dir() -> Path:
    given = os.environ.get("REGEN_SGLANG_WHEELS")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "regen" / "sglang-wheels"


def fetch_wheel(version: str) -> Path:
    """The cached wheel of sglang `version`, downloaded first if absent; skips the calling test when
    the package index cannot be reached, fails it for any other reason."""
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as scratch:
        # The wheel of a Linux x86-64 GPU host with SGLang's Python, whatever this machine is.
        argv = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--platform", "manylinux_2_34_x86_64", "--python-version", "3.11", "--implementation", "cp",
            "--retries", "2", "--timeout", "30", f"sglang=={version}", "-d", scratch,
        ]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
        wheels = sorted(Path(scratch).glob(f"sglang-{version}-*.whl"))
        if done.returncode != 0 or not wheels:
            said = (done.stdout + done.stderr).strip()
            # Only the network's absence skips; anything else (the release gone, pip broken) fails.
            if any(marker in said for marker in _OFFLINE) or not _index_reachable():
                pytest.skip(
                    f"no network: pip cannot download sglang=={version} ({said.splitlines()[-1][:200]})"
                )
            pytest.fail(f"pip download sglang=={version} failed ({done.returncode}):\n{said[-2000:]}")
        target = folder / wheels[0].name
        shutil.move(str(wheels[0]), target)
    return target


def _literal_parts(node: ast.AST) -> list[tuple[str, ...]]:
    """A string literal as one part; an f-string as the literal text between its placeholders, once
    for each branch of a placeholder that picks between literals (`{'a' if x else 'b'}`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [(node.value,)]
    if not isinstance(node, ast.JoinedStr):
        return []
    variants: list[list[str]] = [[""]]
    for value in node.values:
        choices = _literal_choices(value)
        if choices is None:
            variants = [[*v, ""] for v in variants]
        else:
            variants = [[*v[:-1], v[-1] + c] for v in variants for c in choices][:8]
    return [tuple(v) for v in variants]


def _literal_choices(value: ast.expr) -> list[str] | None:
    """The texts a piece of an f-string can only be, when they are written in it; else None."""
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return [value.value]
    if isinstance(value, ast.FormattedValue) and value.format_spec is None and value.conversion == -1:
        inner = value.value
        if isinstance(inner, ast.Constant) and isinstance(inner.value, str):
            return [inner.value]
        if isinstance(inner, ast.IfExp):
            branches = [_literal_choices(inner.body), _literal_choices(inner.orelse)]
            if all(b is not None for b in branches):
                return [c for b in branches for c in b or []]
    if isinstance(value, ast.IfExp):
        branches = [_literal_choices(value.body), _literal_choices(value.orelse)]
        if all(b is not None for b in branches):
            return [c for b in branches for c in b or []]
    return None


def message_can_hold(parts: tuple[str, ...], text: str) -> bool:
    """Whether some rendering of a message with these literal parts (placeholders between them)
    contains `text`, with most of `text` written in the message itself: a placeholder may stand for
    a name ("{debug_name} watchdog timeout"), not for the words regen looks for."""
    if any(text in part for part in parts):
        return True
    need = max(8, len(text) / 2)
    for i in range(len(parts) - 1):
        head = parts[i]
        # Each way the text can begin inside part i (a suffix of it, maybe empty), longest first.
        for m in range(min(len(head), len(text)), -1, -1):
            if m and not head.endswith(text[:m]):
                continue
            at, literal = m, m
            for j in range(i + 1, len(parts)):
                # A placeholder, then part j: either the text ends inside it, or part j is whole
                # inside the text (leftmost, which leaves the most room after it).
                part = parts[j]
                rest = text[at:]
                tail = next(
                    (k for k in range(min(len(part), len(rest)), 0, -1) if rest.endswith(part[:k])), 0
                )
                if literal + tail >= need:
                    return True
                found = rest.find(part) if part else 0
                if found < 0:
                    break
                at += found + len(part)
                literal += len(part)
    return False


def source_says(source: str, text: str) -> bool:
    """Whether a message of this Python source (another library's) can contain `text`."""
    messages = [parts for node in ast.walk(ast.parse(source)) for parts in _literal_parts(node)]
    return any(message_can_hold(parts, text) for parts in messages)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's exit, as an exception to read
        raise ValueError(message)


class _Struct:
    """msgspec.Struct as far as api_types.py needs it: keyword construction, class keywords."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__()

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


class RealSGLang:
    """One release's wheel, read as a zip."""

    def __init__(self, wheel: Path) -> None:
        self.wheel = wheel
        self.zip = zipfile.ZipFile(wheel)
        self.version = wheel.name.split("-")[1]

    def source(self, path: str) -> str:
        """A file of the package, by its path under `sglang/`."""
        return self.zip.read(f"sglang/{path}").decode("utf-8")

    def has(self, path: str) -> bool:
        return f"sglang/{path}" in self.zip.namelist()

    def sources(self) -> Iterator[tuple[str, str]]:
        for name in self.zip.namelist():
            if name.startswith("sglang/") and name.endswith(".py"):
                yield name[len("sglang/") :], self.zip.read(name).decode("utf-8", "replace")

    def tree(self, path: str) -> ast.Module:
        return ast.parse(self.source(path))

    # ------------------------------------------------------------------------------ the command line

    def _arg_files(self) -> list[str]:
        fields = sorted(
            n[len("sglang/") :]
            for n in self.zip.namelist()
            if n.startswith("sglang/srt/arg_groups/fields/") and n.endswith(".py")
        )
        return [*fields, "srt/server_args.py"]

    @cached_property
    def actions(self) -> list[tuple[str, ...]]:
        """Every action of `sglang serve`'s parser: its option strings, aliases together."""
        found: list[tuple[str, ...]] = []
        for path in self._arg_files():
            for node in ast.walk(self.tree(path)):
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    action = _field_action(node.target.id, node.annotation)
                    if action:
                        found.append(action)
                elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                    names = [
                        a.value
                        for a in node.args
                        if isinstance(a, ast.Constant)
                        and isinstance(a.value, str)
                        and a.value.startswith("--")
                    ]
                    if names:
                        found.append(tuple(names) + _negations(names, node.keywords))
        return found

    @cached_property
    def flags(self) -> set[str]:
        return {flag for action in self.actions for flag in action}

    def parse(self, argv: list[str]) -> str:
        """The action argparse picks for `argv`'s first flag (its first option string), as the real
        parser would: exact, or a unique prefix; raises ValueError with argparse's own words."""
        parser = _Parser(prog="sglang serve", add_help=False, conflict_handler="resolve")
        for names in self.actions:
            parser.add_argument(*names, dest=names[0], nargs="?")
        namespace, _ = parser.parse_known_args(argv)
        chosen = [dest for dest, value in vars(namespace).items() if value is not None]
        if len(chosen) != 1:
            raise ValueError(f"{argv[0]} is not an option of sglang serve")
        return chosen[0]

    def fields(self) -> set[str]:
        """The server-argument record's field names (the keys of /server_info's flat dict)."""
        names: set[str] = set()
        for path in self._arg_files():
            for node in ast.walk(self.tree(path)):
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    names.add(node.target.id)
        return names

    # --------------------------------------------------------------------------------- log messages

    @cached_property
    def messages(self) -> list[tuple[str, ...]]:
        """Every string literal and f-string of the server (`srt/` and the top-level modules), as
        literal parts; kept beside the wheel after the first reading (parsing takes a while)."""
        kept = self.wheel.with_name(self.wheel.name + f".messages-{_MESSAGES_FORMAT}.json")
        if kept.exists():
            return [tuple(m) for m in json.loads(kept.read_text(encoding="utf-8"))]
        out: list[tuple[str, ...]] = []
        for path, text in self.sources():
            if not (path.startswith("srt/") or "/" not in path):
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the sources' own escape-sequence warnings
                try:
                    tree = ast.parse(text)
                except SyntaxError:
                    continue
            for node in ast.walk(tree):
                out.extend(parts for parts in _literal_parts(node) if any(parts))
        scratch = kept.with_suffix(".tmp")
        scratch.write_text(json.dumps(out), encoding="utf-8")
        scratch.replace(kept)
        return out

    def says(self, text: str) -> bool:
        """Whether some message of the package can contain `text`."""
        # Most of the text is in the message itself, so one of its words is (a quick first cut).
        words = re.findall(r"[A-Za-z_]{4,}", text)
        return any(
            message_can_hold(parts, text)
            for parts in self.messages
            if not words or any(word in part for part in parts for word in words)
        )

    # ----------------------------------------------------------------------------- the JSON contract

    def api_types(self) -> types.ModuleType:
        """0.5.23's generated /generate contract (`api/v1/api_types.py`), executed on its own."""
        module = types.ModuleType(f"sglang_api_types_{self.version.replace('.', '_')}")
        stubbed = "msgspec" not in sys.modules
        try:
            import msgspec  # noqa: F401
        except ImportError:
            sys.modules["msgspec"] = types.SimpleNamespace(Struct=_Struct)  # type: ignore[assignment]
        else:
            stubbed = False
        try:
            exec(compile(self.source("api/v1/api_types.py"), "api_types.py", "exec"), module.__dict__)
        finally:
            if stubbed:
                sys.modules.pop("msgspec", None)
        return module


def _field_action(name: str, annotation: ast.expr) -> tuple[str, ...]:
    """The option strings of one `A[type, meta...]` field; () when it is no command-line flag."""
    if not (isinstance(annotation, ast.Subscript) and getattr(annotation.value, "id", None) == "A"):
        return ()
    items = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
    for meta in items[1:]:
        if isinstance(meta, ast.Constant) and isinstance(meta.value, str):
            return (_cli_name(name),)
        if isinstance(meta, ast.Call) and getattr(meta.func, "id", None) == "Arg":
            keywords = {k.arg: k.value for k in meta.keywords}
            no_cli = keywords.get("no_cli")
            if isinstance(no_cli, ast.Constant) and no_cli.value:
                return ()
            names = [ast.literal_eval(keywords["cli_name"]) if "cli_name" in keywords else _cli_name(name)]
            if "aliases" in keywords:
                names += list(ast.literal_eval(keywords["aliases"]))
            return tuple(names) + _negations(names, meta.keywords)
    return ()


def _cli_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def _negations(names: list[str], keywords: list[ast.keyword]) -> tuple[str, ...]:
    """argparse.BooleanOptionalAction adds `--no-NAME` for each long option."""
    for k in keywords:
        if k.arg == "action" and getattr(k.value, "attr", None) == "BooleanOptionalAction":
            return tuple("--no-" + n[2:] for n in names if n.startswith("--"))
    return ()
