"""A stand-in `nvidia-smi` for hosts without GPUs: the query forms regen uses (docs/sglang.md,
"The stand-in launcher"). Standard library only, so any python3 on the host runs it.

GPUs are simulated H200s (count from REGEN_SIM_GPUS, default 8). A stand-in SGLang server running on
the machine (a process whose command line is `-m sglang.launch_server`) occupies its first --tp GPUs:
it is listed as a compute process, and those GPUs show memory in use and utilisation, so a preflight
that wants free GPUs and a stop that wants them empty both see the truth. With REGEN_SIM_GPU_SCOPE
set, only servers started with the same value in their environment count: one simulated host per
scope, so tests running side by side on one machine do not see each other's servers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["main"]

_SCOPE_ENV = "REGEN_SIM_GPU_SCOPE"
_TOTAL_MIB = 143771
_SERVER_MIB = 131072
_GPU_FIELDS = (
    "index",
    "name",
    "memory.total",
    "memory.used",
    "memory.free",
    "utilization.gpu",
    "temperature.gpu",
    "power.draw",
    "uuid",
)
_APP_FIELDS = ("pid", "process_name", "used_memory", "gpu_uuid")


@dataclass(frozen=True, slots=True)
class _Server:
    pid: int
    tp: int


def _in_scope(entry: Path, scope: str | None) -> bool:
    if scope is None:
        return True
    try:
        environ = (entry / "environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{_SCOPE_ENV}={scope}".encode() in environ


def _servers() -> list[_Server]:
    scope = os.environ.get(_SCOPE_ENV)
    found: list[_Server] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if "sglang.launch_server" not in args or "-m" not in args or not _in_scope(entry, scope):
            continue
        tp = 1
        for i, arg in enumerate(args):
            name, _, value = arg.partition("=")
            # argparse accepts any unique prefix of --tp-size, as the real launcher does.
            if name == "--tensor-parallel-size" or (len(name) >= 4 and "--tp-size".startswith(name)):
                raw = value or (args[i + 1] if i + 1 < len(args) else "")
                if raw.isdigit():
                    tp = int(raw)
        found.append(_Server(int(entry.name), tp))
    return sorted(found, key=lambda s: s.pid)


def _gpu_rows(count: int, servers: list[_Server]) -> list[dict[str, str]]:
    busy = min(count, max((s.tp for s in servers), default=0))
    rows = []
    for i in range(count):
        used = _SERVER_MIB if i < busy else 0
        rows.append(
            {
                "index": str(i),
                "name": "NVIDIA H200",
                "memory.total": str(_TOTAL_MIB),
                "memory.used": str(used),
                "memory.free": str(_TOTAL_MIB - used),
                "utilization.gpu": "95" if used else "0",
                "temperature.gpu": "61" if used else "32",
                "power.draw": "612.45" if used else "74.12",
                "uuid": f"GPU-5a1e0000-0000-4000-8000-{i:012d}",
            }
        )
    return rows


def _app_rows(servers: list[_Server], count: int) -> list[dict[str, str]]:
    rows = []
    for s in servers:
        for i in range(min(count, s.tp)):
            rows.append(
                {
                    "pid": str(s.pid),
                    "process_name": "python3",
                    "used_memory": str(_SERVER_MIB),
                    "gpu_uuid": f"GPU-5a1e0000-0000-4000-8000-{i:012d}",
                }
            )
    return rows


def _units(field: str, value: str, nounits: bool) -> str:
    if nounits:
        return value
    if field.startswith("memory.") or field == "used_memory":
        return f"{value} MiB"
    if field == "utilization.gpu":
        return f"{value} %"
    if field == "power.draw":
        return f"{value} W"
    return value


def _print(rows: list[dict[str, str]], fields: list[str], fmt: set[str]) -> None:
    nounits = "nounits" in fmt
    if "noheader" not in fmt:
        print(", ".join(fields))
    for row in rows:
        print(", ".join(_units(f, row[f], nounits) for f in fields))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    count = int(os.environ.get("REGEN_SIM_GPUS", "8"))
    servers = _servers()
    query: tuple[str, list[str]] | None = None
    fmt: set[str] = set()
    for arg in args:
        name, _, value = arg.partition("=")
        if name in ("--query-gpu", "--query-compute-apps"):
            query = (name, [f.strip() for f in value.split(",") if f.strip()])
        elif name == "--format":
            fmt = {f.strip() for f in value.split(",")}
        else:
            print(
                f'Invalid combination of input arguments. Please run "nvidia-smi -h" for help.\n({arg})',
                file=sys.stderr,
            )
            return 2
    if query is None:
        for row in _gpu_rows(count, servers):
            print(
                f"GPU {row['index']}: {row['name']} ({row['uuid']}), {row['memory.used']}MiB / "
                f"{row['memory.total']}MiB"
            )
        return 0
    if "csv" not in fmt:
        print('Format "csv" is required for queries in this stand-in.', file=sys.stderr)
        return 2
    kind, fields = query
    allowed = _GPU_FIELDS if kind == "--query-gpu" else _APP_FIELDS
    for f in fields:
        if f not in allowed:
            print(f'Field "{f}" is not a valid field to query.', file=sys.stderr)
            return 2
    rows = _gpu_rows(count, servers) if kind == "--query-gpu" else _app_rows(servers, count)
    _print(rows, fields, fmt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
