"""The SGLang router (smg, from PyPI) on this machine, in front of the GPU hosts' tunnels.

One child process per run: ``python -m smg launch`` bound to 127.0.0.1 (both its listeners), the
tunnels' URLs as workers, round-robin. It dies with the job (a parent-death signal), so a job that is
killed leaves no router behind. docs/sglang.md §13 has the flags and why: the default cache-aware
policy put every request on one worker; a worker only registers once it answers /health and
/v1/models; workers are removed and added through ``DELETE /workers/{id}`` and ``POST /workers``.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from regen.engine.errors import RegenError
from regen.engine.lifetime import die_with_parent
from regen.engine.schema import RouterView

READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0  # smg drains for about 5 s after TERM even when idle
HEALTH_INTERVAL_S = 2
_TIMEOUT = aiohttp.ClientTimeout(total=10.0, sock_connect=5.0)


class RouterError(RegenError, RuntimeError):
    """The router could not be started or does not answer; the message says why."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# smg 1.13 leaves a worker with 8 queued requests or 0.8 KV usage out of routing (its "overload
# protection", on by default), and when every worker is over, routes by loads polled every 10 s.
# regen keeps its own queue band (healthy_queue_min/max, healthy_kv_usage_max) far above 8 per
# worker, so the router's veto is switched off: measured in docs/sglang.md, "The router's overload
# veto" (bench/router_overload.py). The one rule; everything that launches smg takes it from here.
OVERLOAD_ARGS: tuple[str, ...] = ("--disable-worker-overload-protection",)
# smg 1.13 also bounds what it admits at once (`--max-concurrent-requests` unset: 1024 per core, at
# least 4096, then a queue of 100) and answers 429 past it. The job's own in-flight limit is the bound
# (job.concurrency, lowered by the servers' band); a second one in the router only turns a cluster's
# full in-flight into refusals and retries: at 64 nodes x 8 GPUs it refused 1,130 attempts in 20 s
# and held the job to 5,149 in flight of 8,192 (BENCHMARKS.md, the cluster-scale section). 0 lifts it.
ADMISSION_ARGS: tuple[str, ...] = ("--max-concurrent-requests", "0")


def router_argv(
    worker_urls: Sequence[str],
    port: int,
    metrics_port: int,
    request_timeout_s: float,
    overload_args: Sequence[str] = OVERLOAD_ARGS,
    admission_args: Sequence[str] = ADMISSION_ARGS,
) -> list[str]:
    """The smg command line; ``overload_args`` and ``admission_args`` are regen's rules unless a
    benchmark or test asks for others."""
    return [
        sys.executable,
        "-m",
        "smg",
        "launch",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *worker_urls,
        "--policy",
        "round_robin",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(metrics_port),
        "--worker-startup-check-interval",
        "1",
        "--health-check-interval-secs",
        str(HEALTH_INTERVAL_S),
        "--request-timeout-secs",
        str(int(request_timeout_s)),
        *overload_args,
        *admission_args,
        "--log-level",
        "warn",
    ]


class Router:
    """smg in front of ``worker_urls``; ``url`` is where the backend sends."""

    def __init__(self, worker_urls: Sequence[str], *, log: Path, request_timeout_s: float) -> None:
        self.worker_urls = list(worker_urls)
        self.log = log
        self.request_timeout_s = request_timeout_s
        self.port = 0
        self.metrics_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.state = "stopped"
        self.error: str | None = None
        self.version: str | None = None
        self.removed: set[str] = set()  # worker URLs regen took out

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> str:
        try:
            from importlib.metadata import PackageNotFoundError, version

            self.version = version("smg")
        except PackageNotFoundError:
            raise RouterError(
                "several [[hosts]] need the SGLang router, but smg is not installed: pip install 'regen[router]'"
            ) from None
        self.port, self.metrics_port = _free_port(), _free_port()
        argv = router_argv(self.worker_urls, self.port, self.metrics_port, self.request_timeout_s)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                preexec_fn=die_with_parent,  # SIGTERM when the job ends, even by SIGKILL
            )
            out.write(f"regen: router pid {self.proc.pid}: {' '.join(argv)}\n".encode())
        self.state = "starting"
        deadline = time.monotonic() + READY_TIMEOUT_S
        said = ""
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    self.state = "failed"
                    raise RouterError(
                        f"the router exited at once (status {self.proc.returncode}); see {self.log}"
                    )
                try:
                    async with session.get(self.url + "/readiness", timeout=_TIMEOUT) as resp:
                        body = await resp.read()
                        said = f"{resp.status} {body[:200].decode('utf-8', 'replace')}"
                        if resp.status == 200:
                            ready = json.loads(body).get("healthy_workers")
                            if ready == len(self.worker_urls):
                                self.state = "running"
                                return self.url
                except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                    said = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(0.2)
        await self.stop()
        raise RouterError(
            f"the router did not register every worker in {READY_TIMEOUT_S:.0f} s ({said}); see {self.log}"
        )

    async def workers(self) -> list[dict[str, Any]]:
        """The router's own list: per worker its URL, id, health and load."""
        async with (
            aiohttp.ClientSession() as session,
            session.get(self.url + "/workers", timeout=_TIMEOUT) as resp,
        ):
            body = await resp.json(content_type=None)
        listed = body.get("workers") if isinstance(body, dict) else body
        return [w for w in listed or [] if isinstance(w, dict)]

    async def remove(self, url: str) -> bool:
        """Take worker ``url`` out of the rotation; True when the router accepted it."""
        for worker in await self.workers():
            if worker.get("url") == url and worker.get("id"):
                async with (
                    aiohttp.ClientSession() as session,
                    session.delete(f"{self.url}/workers/{worker['id']}", timeout=_TIMEOUT) as resp,
                ):
                    await resp.read()
                    if resp.status < 300:
                        self.removed.add(url)
                        return True
        return False

    async def add(self, url: str) -> bool:
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.url + "/workers", json={"url": url}, timeout=_TIMEOUT) as resp,
        ):
            await resp.read()
            if resp.status < 300:
                self.removed.discard(url)
                return True
        return False

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()  # our own child, by its pid
            deadline = time.monotonic() + STOP_GRACE_S
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
        await asyncio.to_thread(proc.wait)
        self.state = "stopped"

    def view(self) -> RouterView:
        return {
            "url": self.url,
            "state": self.state,
            "pid": self.proc.pid if self.proc else None,
            "version": self.version,
            "workers": len(self.worker_urls),
            "removed": sorted(self.removed),
            "error": self.error,
            "log": str(self.log),
        }


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


__all__ = ["Router", "RouterError", "router_argv"]
