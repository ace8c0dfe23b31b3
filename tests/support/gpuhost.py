"""A "GPU host" for the SGLang lifecycle tests: a real sshd on loopback whose logins find the stand-in
`sglang` package and the stand-in `nvidia-smi` (scoped to this host), and the settings that point
regen at it. Only the GPU is pretend: the SSH server, the login shell, the detached launch, the
process group, the log file and the HTTP server behind the tunnel are all real.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regen.sim.sglang.launch import CONFIG_ENV
from tests.support.processes import ROOT, free_port
from tests.support.sglang_sim import STANDIN, model_folder
from tests.support.sshd import SshServer, make_server

# The simulator's startup in well under a second; a couple of helper processes in the server's group.
FAST_SIM: dict[str, Any] = {
    "time_scale": 0.01,
    "startup_weights_s": 20.0,
    "startup_kv_pool_s": 10.0,
    "startup_cuda_graph_s": 10.0,
    "startup_http_s": 1.0,
    "startup_warmup_s": 1.0,
    "output_len_min": 8,
    "output_len_max": 40,
    "min_step_s": 0.002,
    "child_processes": 2,
    "seed": 7,
}


@dataclass
class GpuHost:
    root: Path
    sshd: SshServer
    model: Path
    work: Path
    port: int
    sim_config: Path

    def set_sim(self, **config: Any) -> None:
        """The simulator settings the next launch reads (REGEN_SGLANG_SIM_CONFIG on the host)."""
        self.sim_config.write_text(json.dumps({**FAST_SIM, **config}))

    def settings_text(
        self,
        *,
        name: str = "gpu1",
        extra_sglang: dict[str, Any] | None = None,
        top: str = "",
        others: tuple[tuple[str, GpuHost], ...] = (),
    ) -> str:
        sglang: dict[str, Any] = {
            "port": self.port,
            "tp": 2,
            "work_dir": str(self.work),
            "env": {CONFIG_ENV: str(self.sim_config)},
            "ready_timeout_s": 900.0,
            "stop_grace_s": 5.0,
            **(extra_sglang or {}),
        }
        tables = [self.host_table(name), *(other.host_table(n) for n, other in others)]
        return "\n".join([top, "[sglang]", *_toml_pairs(sglang), *tables]) + "\n"

    def host_table(self, name: str = "gpu1") -> str:
        known = self.sshd.write_known_hosts(self.root / f"known_hosts-{self.sshd.port}")
        host = {
            "name": name,
            "address": "127.0.0.1",
            "port": self.sshd.port,
            "user": self.sshd.user,
            "key_files": [str(self.sshd.client_key)],
            "known_hosts": str(known),
            "data_root": str(self.root / "data"),
            "model_path": str(self.model),
            "python": os.environ.get("REGEN_TEST_HOST_PYTHON", _python()),
            "connect_timeout_s": 5.0,
            "poll_interval_s": 0.5,
            "sglang_port": self.port,
        }
        return "\n".join(["[[hosts]]", *_toml_pairs(host)])

    def record(self) -> dict[str, Any] | None:
        path = self.work / f"sglang-{self.port}.pid"
        return json.loads(path.read_text()) if path.exists() else None

    def log(self) -> str:
        path = self.work / f"sglang-{self.port}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def cleanup(self) -> None:
        """End whatever server a test left (by the pid file's process group), then the sshd."""
        record = self.record()
        if record and isinstance(record.get("pgid"), int):
            kill_group(record["pgid"])
        self.sshd.stop()


def _python() -> str:
    import sys

    return sys.executable


def _toml_pairs(values: dict[str, Any]) -> list[str]:
    out = []
    for key, value in values.items():
        if isinstance(value, dict):
            inner = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in value.items())
            out.append(f"{key} = {{ {inner} }}")
        else:
            out.append(f"{key} = {json.dumps(value)}")
    return out


def group_members(pgid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            found.append(int(stat.parent.name))
    return found


def kill_group(pgid: int) -> None:
    if group_members(pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.05)


def make_gpu_host(root: Path, *, gpus: int = 8) -> GpuHost:
    root.mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(exist_ok=True)
    server = make_server(root / "sshd")
    server.write_config(
        {
            "PATH": f"{STANDIN / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "PYTHONPATH": f"{STANDIN}:{ROOT / 'src'}",
            "REGEN_SIM_GPU_SCOPE": str(root),
            "REGEN_SIM_GPUS": str(gpus),
            "PYTHONUNBUFFERED": "1",
        }
    )
    server.start()
    host = GpuHost(
        root=root,
        sshd=server,
        model=model_folder(root / "models" / "Kimi-K2.5"),
        work=root / "work",
        port=free_port(),
        sim_config=root / "sim.json",
    )
    host.set_sim()
    return host


def sim_state(host: GpuHost) -> dict[str, Any]:
    """The host's stand-in server's own record (GET /_sim/state on its port)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{host.port}/_sim/state", timeout=10) as r:
        return dict(json.loads(r.read()))


def settings_file(host: GpuHost, tmp_path: Path, **extra: object) -> Path:
    """tmp_path/settings.toml for `host`, with `extra` in its [sglang] section."""
    path = tmp_path / "settings.toml"
    path.write_text(host.settings_text(extra_sglang=dict(extra)))
    return path
