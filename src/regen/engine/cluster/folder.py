"""A cluster's folder on the shared filesystem: the current job and, per job, what its nodes read and write.

    WORK_DIR/CLUSTER/current.json         the job regen submitted last: id, folder, how it was started
    WORK_DIR/CLUSTER/job-STAMP/spec.json  the launch spec every node reads (one JSON object)
    .../node.payload                      the node script with its modules (engine/host/remote.py `payload`)
    .../batch.sh                          the batch script (engine/cluster/batch.py)
    .../batch.log                         the batch script's own output
    .../nodes/NODE.json                   each node's state, written by the node (engine/host/scripts/nodeserver.py)
    .../nodes/NODE.log                    each node's server log

Every file regen writes here is written whole (a temporary file, fsync, rename), so a node or a
second regen never reads half of one.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

from regen.engine.cluster.base import ClusterError

CURRENT = "current.json"
NODES = "nodes"


def write_whole(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class ClusterFolder:
    """``WORK_DIR/CLUSTER``: where one cluster's jobs keep their files."""

    def __init__(self, work_dir: Path, cluster: str) -> None:
        self.cluster = cluster
        self.root = work_dir / cluster

    def _make(self, path: Path) -> None:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ClusterError(
                f"cluster {self.cluster}: work_dir {path} cannot be made: {exc.strerror or exc}"
            ) from None

    def current(self) -> dict[str, Any] | None:
        """The last job's record, None when there is none; unreadable is said, never guessed."""
        path = self.root / CURRENT
        try:
            record = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise ClusterError(f"cluster {self.cluster}: {path} cannot be read: {exc}") from None
        if not isinstance(record, dict) or not record.get("job_id") or not record.get("folder"):
            raise ClusterError(f"cluster {self.cluster}: {path} is not a job record regen wrote")
        return record

    def new_job(self) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        folder = self.root / f"job-{stamp}-{secrets.token_hex(3)}"
        self._make(folder / NODES)
        return folder

    def record(self, **record: Any) -> None:
        self._make(self.root)
        write_whole(self.root / CURRENT, json.dumps({**record, "recorded_at": time.time()}, indent=1) + "\n")

    @staticmethod
    def nodes(folder: Path) -> dict[str, dict[str, Any]]:
        """Each node's state file as the node last wrote it, by node name."""
        out: dict[str, dict[str, Any]] = {}
        try:
            entries = sorted((folder / NODES).glob("*.json"))
        except OSError:
            return out
        for path in entries:
            try:
                record = json.loads(path.read_bytes())
            except (OSError, ValueError):
                continue  # renamed into place whole: only a file being replaced can fail, read next time
            if isinstance(record, dict) and isinstance(record.get("node"), str):
                out[record["node"]] = record
        return out


__all__ = ["ClusterFolder", "write_whole"]
