"""Running regen's Python on a GPU host: the code and its arguments go on stdin, never into a shell string.

An SSH command is always a string that the login shell on the host parses. The only string regen
sends is fixed: the configured interpreter, quoted, and a one-line bootstrap that reads the rest
from stdin (docs/gpu-host.md, "Running code on the host"). The first stdin line is a JSON header
with the arguments and the sizes of the sources that follow; a loader then installs the shipped
modules under their own names and runs the main script with ``sys.argv`` set from the header.
So a dataset folder named ``$(touch x)`` or ``a b;c`` reaches the script as a plain string.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh

from regen.engine.host.errors import RemoteError

# The folder holding the `regen` package: shipped modules are read from it by their dotted names.
_ROOT = Path(__file__).resolve().parents[3]
# Modules the host scripts import, in import order, and the entry point.
MODULES = (
    "regen.engine.errors",
    "regen.engine.data.datasets",
    "regen.engine.data.lines",
    "regen.engine.data.validate",
    "regen.engine.host.scripts.probe",
    "regen.engine.host.scripts.identity",
    "regen.engine.host.scripts.survey",
)
ENTRY = "regen.engine.host.scripts.hostcmd"
MIN_PYTHON = (3, 10)
# Exit status of the loader when the host's Python is too old for the shipped modules.
EXIT_OLD_PYTHON = 3

# No quotes, backslashes or "!" inside: it must read the same in sh, bash, zsh, fish and csh.
BOOTSTRAP = 'import sys,json;i=sys.stdin.buffer;h=json.loads(i.readline());exec(i.read(h["loader"]))'
# The same loader, the payload read from a file named by the one argument: a cluster node's step
# (engine/cluster/batch.py) finds it on the shared filesystem, and its stdin is not the payload.
FILE_BOOTSTRAP = (
    'import sys,json;i=open(sys.argv[1],"rb");h=json.loads(i.readline());exec(i.read(h["loader"]))'
)

LOADER = f"""
import sys, types
if sys.version_info < {MIN_PYTHON!r}:
    sys.stderr.write("regen needs Python {".".join(map(str, MIN_PYTHON))} or newer on the host, found %s\\n"
                     % sys.version.split()[0])
    sys.exit({EXIT_OLD_PYTHON})
def _package(name):
    if name in sys.modules:
        return sys.modules[name]
    module = types.ModuleType(name)
    module.__path__ = []
    sys.modules[name] = module
    if "." in name:
        parent, _, leaf = name.rpartition(".")
        setattr(_package(parent), leaf, module)
    return module
for _name, _size in h["modules"]:
    _source = i.read(_size)
    _parent, _, _leaf = _name.rpartition(".")
    _module = types.ModuleType(_name)
    _module.__file__ = "<regen>/" + _name.replace(".", "/") + ".py"
    _module.__package__ = _parent
    sys.modules[_name] = _module
    if _parent:
        setattr(_package(_parent), _leaf, _module)
    exec(compile(_source, _module.__file__, "exec"), _module.__dict__)
_main = i.read(h["main"])
sys.argv = list(h["argv"])
_globals = {{"__name__": "__main__", "__file__": sys.argv[0], "__builtins__": __builtins__}}
exec(compile(_main, sys.argv[0], "exec"), _globals)
"""


def _source(module: str) -> bytes:
    return (_ROOT / (module.replace(".", "/") + ".py")).read_bytes()


def payload(argv: Sequence[str], *, entry: str = ENTRY, modules: Sequence[str] = MODULES) -> bytes:
    """What goes on stdin: the header line, the loader, each module's source, the entry's source."""
    loader = LOADER.encode()
    sources = [_source(m) for m in modules]
    main = _source(entry)
    header = {
        "loader": len(loader),
        "modules": [[m, len(s)] for m, s in zip(modules, sources, strict=True)],
        "main": len(main),
        "argv": [f"<regen>/{entry.replace('.', '/')}.py", *argv],
    }
    return json.dumps(header).encode() + b"\n" + loader + b"".join(sources) + main


def interpreter_words(python: str) -> list[str]:
    """The ``python`` setting as words: a path or a command, possibly with arguments."""
    words = shlex.split(python)
    if not words:
        raise ValueError("python is empty")
    return words


def command_line(python: str) -> str:
    """The one string the host's shell parses: the interpreter and the fixed bootstrap, quoted."""
    words = interpreter_words(python)
    first = words[0]
    # "~/venv/bin/python": the home is the shell's to expand, the rest stays quoted.
    head = '"$HOME"/' + shlex.quote(first[2:]) if first.startswith("~/") else shlex.quote(first)
    return " ".join([head, *(shlex.quote(w) for w in words[1:]), "-c", shlex.quote(BOOTSTRAP)])


@dataclass(slots=True)
class ScriptResult:
    exit_status: int | None
    records: list[dict[str, Any]] = field(default_factory=list)
    stderr: str = ""
    # Lines on stdout that were not records: a login script's chatter, kept for error messages.
    noise: list[str] = field(default_factory=list)

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("type") == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.of_type(kind)
        if not found:
            raise RemoteError(f"the host script gave no {kind!r} record")
        return found[-1]


def parse_output(exit_status: int | None, stdout: bytes, stderr: bytes) -> ScriptResult:
    result = ScriptResult(exit_status, stderr=stderr.decode("utf-8", "replace"))
    for raw in stdout.splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        if isinstance(record, dict) and "type" in record:
            result.records.append(record)
        elif raw.strip():
            result.noise.append(raw.decode("utf-8", "replace"))
    return result


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


async def run_hostcmd(
    conn: asyncssh.SSHClientConnection,
    python: str,
    argv: Sequence[str],
    *,
    timeout: float | None = None,
    entry: str = ENTRY,
    modules: Sequence[str] = MODULES,
) -> ScriptResult:
    """Run ``hostcmd.py ARGV...`` (or another ``entry`` script with its ``modules``) on the host over
    one channel of ``conn``; raises RemoteError when it fails.

    Connection loss propagates as asyncssh's own errors, so the caller can reconnect and retry.
    """
    completed = await conn.run(
        command_line(python),
        input=payload(argv, entry=entry, modules=modules),
        encoding=None,
        check=False,
        timeout=timeout,
    )
    stdout = completed.stdout if isinstance(completed.stdout, bytes) else b""
    stderr = completed.stderr if isinstance(completed.stderr, bytes) else b""
    if completed.exit_status is None and completed.exit_signal is None:
        # The channel closed without an exit status: the connection went away under it.
        raise asyncssh.ConnectionLost("the channel closed before the host script ended")
    result = parse_output(completed.exit_status, stdout, stderr)
    errors = result.of_type("error")
    if errors:
        raise RemoteError(f"host script failed: {errors[-1].get('message')}")
    if completed.exit_status == 127:
        raise RemoteError(
            f"{interpreter_words(python)[0]!r} not found on the host (set python in its [[hosts]] table)"
        )
    if completed.exit_status != 0:
        said = _last_line(result.stderr) or (result.noise[-1] if result.noise else "")
        status = (
            f"exit {completed.exit_status}"
            if completed.exit_status is not None
            else f"signal {completed.exit_signal[0] if completed.exit_signal else '?'}"
        )
        raise RemoteError(f"host script failed ({status}){': ' + said if said else ''}")
    if not result.of_type("done"):
        raise RemoteError("host script ended without finishing its output")
    return result
