"""Slurm behind the seam: sbatch (or srun steps in an allocation you hold), squeue, scancel.

regen runs where Slurm's commands work and ``SLURM_CONF`` (if any) points at the cluster: a login
node, or a node of the allocation. Every call is an argv, never a shell string, with a timeout; a
command that fails is said in one line naming the cluster and the command's own words.

A node's server is known from two sides (docs/clusters.md, "A node's state"): the node's state file
(what the node script saw: phases, ready, failure) and the queue (whether its step still runs). A
state file that says ready or starting while its step is gone, or whose heartbeat stopped, is a
lost node: its step was killed, or the node went down without a word.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from regen.engine.cluster.base import LIVE_JOB_STATES, ClusterError, ClusterStatus, NodeServer, Submitted
from regen.engine.cluster.batch import STEP_NAME, asked_of, batch_script
from regen.engine.cluster.folder import ClusterFolder, write_whole
from regen.engine.config.settings import ClusterSettings, SGLangSettings, served_model_name
from regen.engine.host.remote import payload
from regen.engine.net.sglang_server import LAUNCH_STREAM_INTERVAL

NODE_ENTRY = "regen.engine.host.scripts.nodeserver"
NODE_MODULES = (
    "regen.engine.errors",
    "regen.engine.data.datasets",
    "regen.engine.host.scripts.probe",
    "regen.engine.host.scripts.sglanglog",
    "regen.engine.host.scripts.identity",
    "regen.engine.host.scripts.sglangctl",
)
FALLBACK_SERVED_NAME = "model"
COMMAND_TIMEOUT_S = 30.0
# A node script writes its state file at least this often (nodeserver.py HEARTBEAT_S is 5 s).
STALE_S = 30.0
# How long a cancel waits for the job and every step to leave the queue.
CANCEL_WAIT_S = 120.0


def parse_job_id(text: str) -> str:
    """sbatch --parsable prints ``ID`` or ``ID;CLUSTER``."""
    first = text.strip().splitlines()[-1] if text.strip() else ""
    job = first.split(";", 1)[0].strip()
    if not job.isdigit():
        raise ValueError(f"sbatch printed {text.strip()[:120]!r}, not a job id")
    return job


def parse_scontrol(text: str) -> dict[str, str]:
    """``scontrol show job -o``'s one line as key=value pairs (a value may hold spaces only at the end)."""
    out: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep:
            out[key] = value
    return out


class Slurm:
    """One ``[[clusters]]`` table with ``kind = "slurm"``."""

    kind = "slurm"

    def __init__(
        self,
        cluster: ClusterSettings,
        sglang: SGLangSettings,
        *,
        env: Mapping[str, str] | None = None,
        stale_s: float = STALE_S,
    ) -> None:
        self.settings = cluster
        self.sglang = sglang
        self.name = cluster.name
        self.env = dict(os.environ if env is None else env)
        self.stale_s = stale_s
        self.folder = ClusterFolder(cluster.work_dir, cluster.name)

    # ---------------------------------------------------------------------------- commands

    async def _run(self, *argv: str, check: bool = True) -> tuple[int, str, str]:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self.env,
            )
        except FileNotFoundError:
            raise ClusterError(
                f"cluster {self.name}: {argv[0]} is not on PATH: regen runs where Slurm's commands work "
                "(a login node, or a node of your allocation)"
            ) from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), COMMAND_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise ClusterError(
                f"cluster {self.name}: {argv[0]} did not answer in {COMMAND_TIMEOUT_S:.0f} s"
            ) from None
        code = proc.returncode or 0
        text, said = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        if check and code != 0:
            lines = [line.strip() for line in said.splitlines() if line.strip()]
            raise ClusterError(
                f"cluster {self.name}: {argv[0]} failed (exit {code}): {lines[-1] if lines else 'no message'}"
            )
        return code, text, said

    # ------------------------------------------------------------------------------ submit

    def spec(self, folder: Path) -> dict[str, Any]:
        """The launch spec every node reads: a host's launch rules (engine/host/sglang.py `ServerSpec`)."""
        sglang = self.sglang
        return {
            "dir": str(folder),
            "port": self.settings.port or sglang.port,
            "model_path": self.settings.model_path,
            "tp": sglang.tp,
            "served_model_name": served_model_name(sglang, [self.settings]) or FALLBACK_SERVED_NAME,
            "launch_args": list(sglang.launch_args),
            "stream_interval": LAUNCH_STREAM_INTERVAL,
            "env": dict(sglang.env),
            "grace_s": sglang.stop_grace_s,
            # Slurm gave the job its GPUs; with none asked for there are none to check.
            "check_gpus": self.settings.gpus_per_node > 0,
            "check_port": False,  # the node takes the first free port from `port` up
        }

    async def submit(self) -> Submitted:
        status = await self.watch()
        if status.queued:
            return Submitted(status, already=True)
        folder = self.folder.new_job()
        write_whole(folder / "spec.json", json.dumps(self.spec(folder), indent=1) + "\n", 0o600)
        (folder / "node.payload").write_bytes(
            payload([str(folder / "spec.json")], entry=NODE_ENTRY, modules=NODE_MODULES)
        )
        script = batch_script(self.settings, folder)
        write_whole(folder / "batch.sh", script, 0o700)
        if self.settings.allocation:
            record = await self._in_allocation(folder, self.settings.allocation)
        else:
            try:
                _, out, _ = await self._run("sbatch", "--parsable", str(folder / "batch.sh"))
            except ClusterError as exc:
                asked = " ".join(asked_of(self.settings))
                raise ClusterError(f"{exc} (the job asked for {asked}); nothing was submitted") from None
            try:
                job = parse_job_id(out)
            except ValueError as exc:
                raise ClusterError(f"cluster {self.name}: {exc}") from None
            record = {"job_id": job, "mode": "batch"}
        self.folder.record(**record, folder=str(folder), kind=self.kind, nodes=self.settings.nodes)
        return Submitted(await self.watch(), script=script)

    async def _in_allocation(self, folder: Path, job: str) -> dict[str, Any]:
        """The batch script run here as the allocation's own steps: nothing is submitted."""
        _, out, _ = await self._run("squeue", "-h", "-j", job, "-o", "%T|%N|%D", check=False)
        fields = out.strip().split("|")
        if len(fields) != 3 or fields[0] != "RUNNING":
            said = f"is {fields[0]}" if len(fields) == 3 else "is not in the queue"
            raise ClusterError(f"cluster {self.name}: allocation {job} {said}: nothing was started")
        if int(fields[2]) < self.settings.nodes:
            raise ClusterError(
                f"cluster {self.name}: allocation {job} holds {fields[2]} nodes, but nodes = {self.settings.nodes}"
            )
        log = os.open(folder / "batch.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            proc = subprocess.Popen(
                ["bash", str(folder / "batch.sh")],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**self.env, "SLURM_JOB_ID": job, "REGEN_NODELIST": fields[1]},
                start_new_session=True,  # outlives this command, like a batch job
                close_fds=True,
            )
        finally:
            os.close(log)
        return {"job_id": job, "mode": "allocation", "launcher_pid": proc.pid}

    # ------------------------------------------------------------------------------- watch

    async def _job_state(self, job: str) -> tuple[str | None, str | None]:
        code, out, _ = await self._run("squeue", "-h", "-j", job, "-o", "%T|%r", check=False)
        line = out.strip().splitlines()[0] if code == 0 and out.strip() else ""
        if "|" in line:
            state, reason = line.split("|", 1)
            return state, (None if reason in ("None", "") else reason)
        # Gone from the queue: scontrol remembers a finished job for a while (MinJobAge).
        code, out, _ = await self._run("scontrol", "show", "job", "-o", job, check=False)
        fields = parse_scontrol(out) if code == 0 else {}
        why = fields.get("Reason")
        return fields.get("JobState") or "ENDED", (None if why in (None, "None") else why)

    async def _steps(self, job: str) -> dict[str, str]:
        """Node -> step id of this job's node steps still in the queue."""
        code, out, _ = await self._run("squeue", "-h", "-s", "-j", job, "-o", "%i|%j|%N", check=False)
        steps: dict[str, str] = {}
        for line in out.splitlines() if code == 0 else []:
            parts = line.strip().split("|")
            if len(parts) == 3 and parts[1] == STEP_NAME:
                steps[parts[2]] = parts[0]
        return steps

    async def watch(self) -> ClusterStatus:
        current = self.folder.current()
        if current is None:
            return ClusterStatus(self.name, self.kind, None, None, wanted=self.settings.nodes)
        job = str(current["job_id"])
        folder = Path(str(current["folder"]))
        # The nodes' files before the queue: a file read first whose step the queue then lacks
        # belongs to a step that ended (a step is queued before its node writes its file).
        records = ClusterFolder.nodes(folder)
        state, reason = await self._job_state(job)
        steps = await self._steps(job)
        # In an allocation (the operator's), regen's job is its steps and the launcher here.
        if (
            current.get("mode") == "allocation"
            and state in LIVE_JOB_STATES
            and not steps
            and not _alive(current.get("launcher_pid"))
        ):
            state, reason = "ENDED", "regen's steps in the allocation have ended"
        now = time.time()
        nodes = [self._node(name, rec, name in steps, state, now) for name, rec in records.items()]
        for name in sorted(set(steps) - set(records)):
            nodes.append(NodeServer(name, "starting", phase="step started"))
        missing = self.settings.nodes - len(nodes)
        if missing > 0 and state in LIVE_JOB_STATES:
            nodes.extend(
                NodeServer(f"(node {i})", "pending", phase=reason)
                for i in range(len(nodes) + 1, self.settings.nodes + 1)
            )
        return ClusterStatus(
            self.name,
            self.kind,
            job,
            state,
            reason,
            tuple(sorted(nodes, key=lambda n: n.node)),
            folder=str(folder),
            wanted=self.settings.nodes,
        )

    def _node(
        self, name: str, rec: dict[str, Any], stepping: bool, job_state: str | None, now: float
    ) -> NodeServer:
        said = str(rec.get("state") or "starting")
        failure = rec.get("failure")
        heartbeat = now - float(rec.get("updated_at") or 0)
        state = said
        if said in ("starting", "ready"):
            if not stepping:
                state = "lost"
                failure = (
                    "its step ended without a word from the node (killed, or the node was lost)"
                    if job_state in LIVE_JOB_STATES
                    else f"the job is {job_state}"
                )
            elif heartbeat > self.stale_s:
                state = "lost"
                failure = f"no word from the node for {heartbeat:.0f} s (its step hangs, or the node is down)"
        phases = tuple((str(p), float(s)) for p, s in rec.get("phases") or [] if isinstance(p, str))
        ready_at, started = rec.get("ready_at"), rec.get("started_at")
        return NodeServer(
            name,
            state,  # type: ignore[arg-type]
            phase=rec.get("phase"),
            url=rec.get("url"),
            failure=failure,
            log=rec.get("log"),
            version=rec.get("version"),
            identity=rec.get("identity") if isinstance(rec.get("identity"), dict) else None,
            tail=tuple(str(t) for t in rec.get("tail") or []),
            phases=phases,
            ready_after_s=(float(ready_at) - float(started)) if ready_at and started else None,
        )

    async def endpoints(self) -> list[NodeServer]:
        return (await self.watch()).ready

    # ------------------------------------------------------------------------------ cancel

    async def cancel(self, wait_s: float = CANCEL_WAIT_S) -> ClusterStatus:
        current = self.folder.current()
        if current is None:
            return await self.watch()
        job = str(current["job_id"])
        if current.get("mode") == "allocation":
            # Only regen's steps: the allocation itself stays the operator's.
            for step in (await self._steps(job)).values():
                await self._run("scancel", step, check=False)
            pid = current.get("launcher_pid")
            if isinstance(pid, int) and _alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(int(pid), signal.SIGTERM)
        else:
            status = await self.watch()
            if status.queued:
                await self._run("scancel", job)
        deadline = time.monotonic() + wait_s
        while True:
            status = await self.watch()
            steps = await self._steps(job)
            gone = not steps and (current.get("mode") == "allocation" or not status.queued)
            if gone:
                return status
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"cluster {self.name}: job {job} is still {status.job_state} {wait_s:.0f} s after scancel "
                    f"(steps left: {', '.join(sorted(steps)) or 'none'})"
                )
            await asyncio.sleep(0.5)


def _alive(pid: object) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


__all__ = ["Slurm", "parse_job_id", "parse_scontrol"]
