"""A real Slurm on loopback for the cluster tests: one slurmctld and several slurmd on this machine.

The nodes are aliases (``NodeName=node[1-3] NodeHostname=localhost``, each slurmd its own port and
``slurmd -N nodeX``), CPU only; auth is ``auth/none`` (22.05 still ships it) so no munged is needed.
Everything (slurm.conf, state, spool, logs, pid files) lives in one temp folder, and every client
call goes through :meth:`Slurm.env`, whose ``SLURM_CONF`` points at it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from regen.sim.sglang.launch import CONFIG_ENV
from tests.support.gpuhost import FAST_SIM
from tests.support.processes import ROOT, free_port
from tests.support.sglang_sim import STANDIN, model_folder

SLURMCTLD = shutil.which("slurmctld") or "/usr/sbin/slurmctld"
SLURMD = shutil.which("slurmd") or "/usr/sbin/slurmd"


def have_slurm() -> bool:
    return os.path.exists(SLURMCTLD) and os.path.exists(SLURMD) and shutil.which("sbatch") is not None


@dataclass
class Slurm:
    root: Path
    nodes: list[str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), env=self.env(), capture_output=True, text=True, check=check, timeout=30
        )

    def queue(self) -> list[str]:
        """Job ids in the queue (any state)."""
        out = self.run("squeue", "-h", "-o", "%i").stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def wait_empty(self, timeout: float = 60.0) -> None:
        """Until no job is in the queue (a cancelled one leaves once its steps' processes are gone)."""
        deadline = time.monotonic() + timeout
        while self.queue():
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs still queued: {self.queue()}; logs in {self.root}")
            time.sleep(0.2)

    def wait_idle(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout
            states = dict(line.split() for line in out.splitlines() if line.strip())
            if len(states) == len(self.nodes) and all(s.startswith("idle") for s in states.values()):
                return
            time.sleep(0.3)
        raise TimeoutError(f"slurm nodes not idle: {out!r}; logs in {self.root}")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def start_slurm(root: Path, n_nodes: int = 3, cpus: int = 2) -> Slurm:
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool", "log"):
        (root / sub).mkdir(exist_ok=True)
    nodes = [f"node{i}" for i in range(1, n_nodes + 1)]
    ctld_port = free_port()
    user = os.environ.get("USER") or "root"
    lines = [
        "ClusterName=regentest",
        "SlurmctldHost=localhost",
        f"SlurmctldPort={ctld_port}",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        "AuthType=auth/none",
        "CredType=cred/none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        "MpiDefault=none",
        "ReturnToService=2",
        "SlurmdTimeout=30",
        "InactiveLimit=0",
        "KillWait=2",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}/%n",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd-%n.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "JobCompType=jobcomp/none",
        "AccountingStorageType=accounting_storage/none",
    ]
    for node in nodes:
        lines.append(
            f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={free_port()} CPUs={cpus} State=UNKNOWN"
        )
    lines.append(f"PartitionName=gpu Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP")
    (root / "slurm.conf").write_text("\n".join(lines) + "\n")
    slurm = Slurm(root=root, nodes=nodes)
    env = slurm.env()
    try:
        slurm.procs.append(
            subprocess.Popen(
                [SLURMCTLD, "-D", "-i", "-f", str(slurm.conf)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=(root / "log" / "slurmctld.err").open("wb"),
            )
        )
        for node in nodes:
            (root / "spool" / node).mkdir(exist_ok=True)
            slurm.procs.append(
                subprocess.Popen(
                    [SLURMD, "-D", "-N", node, "-f", str(slurm.conf)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=(root / "log" / f"slurmd-{node}.err").open("wb"),
                )
            )
        slurm.wait_idle()
    except BaseException:
        slurm.stop()
        raise
    return slurm


# ------------------------------------------------------------------------------ a cluster of regen's


@dataclass
class LabCluster:
    """A [[clusters]] table on the loopback Slurm: the stand-in SGLang on every node, a shared folder."""

    slurm: Slurm
    root: Path
    model: Path
    port: int
    python: Path

    def settings_text(self, *, top: str = "", nodes: int = 2, **cluster: object) -> str:
        table = {
            "name": "lab",
            "partition": "gpu",
            "nodes": nodes,
            "gpus_per_node": 0,
            "time_limit": "20:00",
            "model_path": str(self.model),
            "work_dir": str(self.root / "shared"),
            "python": str(self.python),
            **cluster,
        }
        sglang = "\n".join(
            [
                "[sglang]",
                f"port = {self.port}",
                "tp = 1",
                "ready_timeout_s = 120.0",
                "stop_grace_s = 5.0",
                "metrics_interval_s = 0.3",
                # PYTHONPATH and the simulator's settings come from the node's python (see `lab_cluster`).
            ]
        )
        lines = ["[[clusters]]", *(f"{k} = {json.dumps(v)}" for k, v in table.items())]
        return "\n".join([top, sglang, *lines]) + "\n"

    def sim(self, node: str | None = None, **config: Any) -> None:
        """The simulator's settings for every node's next launch, or only ``node``'s."""
        path = self.root / (f"sim-{node}.json" if node else "sim.json")
        path.write_text(json.dumps({**FAST_SIM, **config}))

    def state(self, node: str) -> dict[str, Any]:
        """``node``'s state file in the current job's folder."""
        current = json.loads((self.root / "shared" / "lab" / "current.json").read_text())
        return dict(json.loads((Path(current["folder"]) / "nodes" / f"{node}.json").read_text()))


def lab_cluster(slurm: Slurm, root: Path) -> LabCluster:
    """The cluster's files under ``root``; the nodes' python is a wrapper that finds the stand-in
    sglang and points the simulator at ``sim-NODE.json`` when there is one, else ``sim.json``."""
    root.mkdir(parents=True, exist_ok=True)
    model = model_folder(root / "models" / "Kimi-K2.5")
    python = root / "node-python"
    python.write_text(
        "#!/bin/sh\n"
        f"export PYTHONPATH={STANDIN}:{ROOT / 'src'} PYTHONUNBUFFERED=1\n"
        f'config={root}/sim-"$SLURMD_NODENAME".json\n'
        f'[ -f "$config" ] || config={root}/sim.json\n'
        f'export {CONFIG_ENV}="$config"\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    cluster = LabCluster(slurm, root, model, free_port(), python)
    cluster.sim()
    return cluster
