"""Real jobs for the console's tests: the engine against the simulators regen ships, in this process,
over loopback, with every failure the simulators can stage, watched through the real control socket.

Three kinds, as an operator runs them: `openrouter` and `sglang` (one backend each) and `fleets`
(both in one job, paced to a deadline). Each plays a script (`SCRIPTS`): it lets the job run, stages
the simulators' failures (faults drawn per request, a failing provider, a provider serving outside
the precision allowlist, a platform hold, an outage, a closed lane) and sends the commands the
console's keys send, as a console does. What the console received on the socket is kept line by
line (`Watcher.lines`): tests/support/recordings.py writes it down (`make recordings`) for the
console's tests to replay, and tests/integration/job/test_snapshot_schema.py checks every snapshot against
engine/schema.py as it is built and as it arrived.

The job is sped up (short answers, quick ticks) but otherwise runs as `regen run` does:
engine/control/headless.py's `run_headless`, which serves the control socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from regen.console.options import ConsoleOptions
from regen.engine.config.settings import (
    JobSettings,
    OpenRouterSettings,
    Settings,
    SGLangSettings,
    SteeringSettings,
    TokenizerSettings,
)
from regen.engine.control.headless import run_headless
from regen.engine.control.server import SOCKET_NAME, open_control
from regen.engine.job.job import Job
from regen.engine.schema import Snapshot
from regen.sim.openrouter.config import FAULT_CLASSES, SimConfig
from regen.sim.openrouter.server import OpenRouterSim
from regen.sim.sglang.config import SimSGLangConfig
from regen.sim.sglang.server import SGLangSim
from regen.sim.sglang.tokens import SimTokenizer, builtin_tokenizer_folder

KINDS = ("openrouter", "sglang", "fleets")
API_KEY = "sk-sim-test"
DATASETS = (("chat", 4000), ("code", 3000), ("reasoning", 2000))
# Past this many output tokens the code dataset stops taking prompts: the datasets pane's
# "token budget" state (job.dataset_token_budget applies to every dataset; chat and reasoning are
# sized to stay under it in a recording's run).
TOKEN_BUDGET = 400_000
# Every fault class the OpenRouter simulator draws per request, each this often (about one request
# in eight fails somehow). The edge faults (sim/openrouter/config.py EDGE_FAULTS) are left out: a
# client survives them only through its own limits, which take the request timeout to trip.
FAULT_RATE = 0.006
FAILING_PROVIDER = "fireworks"  # fails most of its answers mid-stream: FAIL in the providers pane
ROGUE_PROVIDER = "deepinfra"  # serves fp4 outside the allowlist: quarantined, then excluded by the guard


# ------------------------------------------------------------------------------------ the console


@dataclass
class Received:
    """One line the console received (or a command it sent, with the job's reply), and when."""

    at: float  # wall clock, epoch seconds
    message: dict[str, Any]


class Watcher:
    """A console on the job's control socket that keeps every line it receives, as it came, and
    sends commands as the console's keys do (`{"id", "command", "args"}`, then the reply)."""

    def __init__(self) -> None:
        self.lines: list[Received] = []
        self.snapshots = 0
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        # Commands awaiting their reply: the future, and what was sent.
        self._replies: dict[int, tuple[asyncio.Future[dict[str, Any]], dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._pump: asyncio.Task[None] | None = None
        self._arrived = asyncio.Event()

    async def attach(self, path: Path) -> None:
        self._reader, self._writer, hello = await open_control(path)
        self.lines.append(Received(time.time(), {"hello": hello}))
        self._pump = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self._reader is not None
        while line := await self._reader.readline():
            message = orjson.loads(line)
            if "id" in message and message["id"] in self._replies:
                # Kept here, in the order of the lines: the snapshot the job pushes after a
                # command comes after its reply.
                reply, sent = self._replies.pop(message["id"])
                said = {"ok": message["ok"], "message": message["message"]}
                self.lines.append(Received(time.time(), {"command": sent, "reply": said}))
                reply.set_result(said)
                continue
            self.lines.append(Received(time.time(), message))
            if "snapshot" in message:
                self.snapshots += 1
            self._arrived.set()

    async def command(self, name: str, **args: Any) -> dict[str, Any]:
        """Send one command; the reply (`ok`, `message`) is kept with it, before the snapshot the
        server pushes after it."""
        assert self._writer is not None
        request_id = next(self._ids)
        reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[request_id] = (reply, {"name": name, "args": args})
        self._writer.write(orjson.dumps({"id": request_id, "command": name, "args": args}) + b"\n")
        await self._writer.drain()
        return await asyncio.wait_for(reply, 30)

    async def frames(self, count: int, timeout: float = 60.0) -> None:
        """Wait until `count` more snapshots have arrived."""
        goal = self.snapshots + count
        deadline = time.monotonic() + timeout
        while self.snapshots < goal:
            assert time.monotonic() < deadline, f"{goal - self.snapshots} snapshots short"
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), 1.0)

    async def until_closed(self, timeout: float = 60.0) -> None:
        if self._pump is not None:
            await asyncio.wait_for(self._pump, timeout)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await self._pump


# ---------------------------------------------------------------------------------------- the run


@dataclass
class Run:
    """A real job in this process, its simulators and the watching console, for a script to drive."""

    kind: str
    job: Job
    console: Watcher
    openrouter: OpenRouterSim | None = None
    sglang: SGLangSim | None = None
    notes: list[str] = field(default_factory=list)

    def lane(self, name: str) -> Any:
        return next(lane for lane in self.job.snapshot()["lanes"] if lane["name"] == name)

    async def until(self, what: str, condition: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"{self.kind}: timed out waiting for {what}"
            await asyncio.sleep(0.05)
        self.notes.append(what)

    async def send(self, name: str, frames: int = 1, **args: Any) -> dict[str, Any]:
        """A command as a console key sends it, then a few frames for its effect to show."""
        reply = await self.console.command(name, **args)
        await self.console.frames(frames)
        return reply

    async def outage(self, which: str) -> None:
        """The backend's server gone for a while (stopped), then back on the same port."""
        sim: Any = self.openrouter if which == "openrouter" else self.sglang
        port = sim.port if which == "openrouter" else int(sim.base_url.rsplit(":", 1)[1])
        await sim.stop()
        await self.until(f"{which} out", lambda: self.lane(which)["outage_s"] is not None, 30)
        await self.console.frames(4)
        await sim.start(port=port)
        if which == "sglang":
            await sim.wait_ready(30)
        await self.until(f"{which} back", lambda: self.lane(which)["outage_s"] is None, 30)


def first_routes(snap: Snapshot, name: str = "openrouter") -> list[str]:
    """The slugs of a lane's allowed routes in the providers pane's first order (by name): what the
    console's cursor lands on first, then after one `j`."""
    lane = next(lane for lane in snap["lanes"] if lane["name"] == name)
    allowed = [p for p in lane["providers"] if p["allowed"] and not p["excluded"]]
    return [p["slug"] or p["name"] for p in sorted(allowed, key=lambda p: p["name"].lower())]


def concurrency_step(run: Run, lane: str, direction: int) -> int:
    """What `+` (1) or `-` (-1) asks for now: the console's step (console/app.py action_concurrency,
    console/options.py concurrency_step) from the lane's configured limit."""
    configured = int(run.lane(lane)["concurrency"]["configured"])
    return max(1, configured + direction * max(1, round(configured * ConsoleOptions().concurrency_step)))


async def _openrouter_script(run: Run) -> None:
    console, sim = run.console, run.openrouter
    assert sim is not None
    await run.until("rows", lambda: run.job.snapshot()["rows"] >= 40)
    await console.frames(24)  # the console's tests take their screens around here
    first, second = first_routes(run.job.snapshot())[:2]
    await run.send("pause")
    await run.send("resume")
    await run.send("exclude", provider=first)
    await run.send("include", provider=first)
    await run.send("exclude", provider=second)
    await run.send("include", provider=second)
    await run.send("concurrency", value=concurrency_step(run, "openrouter", +1))
    await run.send("concurrency", value=concurrency_step(run, "openrouter", -1))
    await run.send("budget", value=0.0)  # refused: below what is already spent
    await run.send("budget", value=75.0)
    await run.send("inspect")  # refused: no GPU host
    await run.send("sglang_start")
    await run.send("sglang_stop")
    # A platform limit (X-RateLimit-Reset on a 429): every request waits for its reset.
    sim.config.faults = {**sim.config.faults, "http_429_ratelimit_reset": 1.0}
    await run.until("a platform hold", lambda: run.lane("openrouter")["held_s"] is not None, 30)
    sim.config.faults = {**sim.config.faults, "http_429_ratelimit_reset": FAULT_RATE}
    await run.until("the hold over", lambda: run.lane("openrouter")["held_s"] is None, 60)
    await run.until("a quarantine", lambda: run.job.snapshot()["quarantined"] > 0, 60)
    await run.outage("openrouter")
    await console.frames(4)
    await run.send("stop", cancel=False)


async def _sglang_script(run: Run) -> None:
    console = run.console
    await run.until("rows", lambda: run.job.snapshot()["rows"] >= 40)
    await console.frames(24)
    await run.send("pause")
    await run.send("resume")
    await run.send("concurrency", value=concurrency_step(run, "sglang", +1))
    await run.send("exclude", provider="anything")  # refused: SGLang's routes cannot be excluded
    await run.until("aborts, 503s and drops", lambda: len(run.lane("sglang")["errors"]) >= 3, 60)
    await run.outage("sglang")
    await console.frames(4)
    await run.send("stop", cancel=True)


async def _fleets_script(run: Run) -> None:
    console, paid = run.console, run.openrouter
    assert paid is not None
    await run.until("rows from both fleets", lambda: all(x["rows"] for x in run.job.snapshot()["lanes"]))
    await console.frames(24)
    await run.send("pause", backend="sglang")
    await run.send("resume", backend="sglang")
    await run.send("pause", backend="openrouter")
    await run.send("resume", backend="openrouter")
    await run.send("deadline", value="90m")
    await run.send("deadline", value="none")
    await run.send("deadline", value="1.5h")  # refused by the job's own rule
    await run.send("deadline", value=DEADLINE)
    # OpenRouter's account runs dry: its lane closes (credits) and the GPUs carry on alone.
    paid.config.credits = 0.0
    await run.until("the OpenRouter lane closed", lambda: run.lane("openrouter")["state"] == "closed", 60)
    await console.frames(6)
    await run.send("stop", cancel=False)


SCRIPTS: dict[str, Callable[[Run], Awaitable[None]]] = {
    "openrouter": _openrouter_script,
    "sglang": _sglang_script,
    "fleets": _fleets_script,
}
# The fleets' deadline: the GPUs alone cannot make it, so OpenRouter is bought for part of the work.
DEADLINE = "4m"


# ------------------------------------------------------------------------------- the simulators


def openrouter_config() -> SimConfig:
    faults = dict.fromkeys(FAULT_CLASSES, FAULT_RATE)
    return SimConfig(
        api_keys=[API_KEY],
        time_scale=0.2,
        min_completion_tokens=40,
        max_completion_tokens=400,
        chunk_interval_s=0.05,
        keepalive_interval_s=0.5,
        generation_lookup_delay_s=0.2,
        retry_after_s=1,
        faults=faults,
        provider_faults={FAILING_PROVIDER: {"mid_stream_error": 0.7}},
        rogue_providers=[ROGUE_PROVIDER],
        seed=7,
    )


def sglang_config(**overrides: Any) -> SimSGLangConfig:
    values: dict[str, Any] = {
        "served_model_name": "kimi-k2.5",
        "model_path": "demo/Kimi-K2.5",
        "tp_size": 8,
        "startup_weights_s": 0.0,
        "startup_kv_pool_s": 0.0,
        "startup_cuda_graph_s": 0.0,
        "startup_http_s": 0.0,
        "startup_warmup_s": 0.0,
        "decode_tokens_per_s": 120.0,
        "output_len_min": 40,
        "output_len_max": 400,
        "child_processes": 0,
        "faults": {"abort_rate": 0.01, "http_503_rate": 0.01, "drop_rate": 0.01},
        "seed": 7,
        "time_scale": 0.25,
        **overrides,
    }
    return SimSGLangConfig(**values)


def write_datasets(root: Path) -> list[Path]:
    """The console's three datasets, of simple generated prompts."""
    folders = []
    for name, count in DATASETS:
        folder = root / "datasets" / name
        folder.mkdir(parents=True, exist_ok=True)
        lines = (
            orjson.dumps(
                {"messages": [{"role": "user", "content": f"{name} question {i}: explain topic {i % 17}."}]}
            )
            for i in range(count)
        )
        (folder / "prompts.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
        folders.append(folder)
    return folders


def settings(kind: str, root: Path, *, openrouter_url: str = "", sglang_url: str = "") -> Settings:
    job: dict[str, Any] = {
        "datasets": write_datasets(root),
        "run_dir": root / "run",
        "concurrency": 32,
        "budget_usd": 5.0,
        "dataset_token_budget": TOKEN_BUDGET,
        "backoff_base_s": 0.2,
        "backoff_max_s": 2.0,
        "reconcile_timeout_s": 2.0,
    }
    sections: dict[str, Any] = {
        "openrouter": OpenRouterSettings(
            base_url=openrouter_url or "http://127.0.0.1:9/api/v1",
            api_key=API_KEY,
            max_tokens=512,
            # Price-weighted balancing rather than strict price order, so several providers serve.
            provider={"sort": None},
            # The end of a drained run waits this long for the key's usage to settle (docs/money.md).
            usage_settle_s=0.5,
            usage_settle_max_s=3.0,
        )
    }
    if kind != "openrouter":
        sections["sglang"] = SGLangSettings(
            urls=[sglang_url], served_model_name="kimi-k2.5", metrics_interval_s=0.5
        )
        sections["tokenizer"] = TokenizerSettings(path=root / "tokenizer", workers=1)
    if kind == "sglang":
        job["backend"] = "sglang"
    if kind == "fleets":
        job.update(backends=["sglang", "openrouter"], deadline=DEADLINE)
        sections["steering"] = SteeringSettings(
            interval_s=0.5, smoothing_s=2.0, gpu_tokens_per_s=1500.0, request_tokens_per_s=60.0
        )
    return Settings(job=JobSettings(**job), **sections)


# --------------------------------------------------------------------------------------- playing


@contextlib.asynccontextmanager
async def simulators(kind: str, root: Path) -> AsyncIterator[tuple[OpenRouterSim | None, SGLangSim | None]]:
    openrouter = OpenRouterSim(openrouter_config()) if kind != "sglang" else None
    sglang = None
    if kind != "openrouter":
        builtin_tokenizer_folder(root / "tokenizer")
        # Both fleets: GPUs slower than the deadline needs, so OpenRouter carries a share.
        config = (
            sglang_config(decode_tokens_per_s=40.0, max_running_requests=24)
            if kind == "fleets"
            else sglang_config()
        )
        sglang = SGLangSim(config, SimTokenizer(root / "tokenizer"))
    try:
        if openrouter is not None:
            await openrouter.start()
        if sglang is not None:
            await sglang.start()
            await sglang.wait_ready(30)
        yield openrouter, sglang
    finally:
        if sglang is not None:
            await sglang.stop()
        if openrouter is not None:
            await openrouter.stop()


async def play(kind: str, root: Path, *, on_snapshot: Callable[[Snapshot], None] | None = None) -> Run:
    """Run `kind`'s job and script to the end; `on_snapshot` sees every snapshot the job builds (the
    control server's included) before it is sent. Returns the run, whose console kept every line."""
    async with simulators(kind, root) as (openrouter, sglang):
        job = Job(
            settings(
                kind,
                root,
                openrouter_url="" if openrouter is None else openrouter.base_url,
                sglang_url="" if sglang is None else sglang.base_url,
            )
        )
        if on_snapshot is not None:
            build = job.snapshot

            def checked() -> Snapshot:
                snap = build()
                on_snapshot(snap)
                return snap

            job.snapshot = checked  # type: ignore[method-assign]
        await job.prepare()
        runner = asyncio.create_task(run_headless(job, out=io.StringIO(), interval_s=3600))
        console = Watcher()
        run = Run(kind, job, console, openrouter, sglang)
        try:
            socket = job.run_dir / SOCKET_NAME
            while not socket.exists():
                assert not runner.done(), "the job ended before it served its socket"
                await asyncio.sleep(0.01)
            await console.attach(socket)
            await SCRIPTS[kind](run)
            await asyncio.wait_for(asyncio.shield(runner), 120)
            await console.until_closed()
        finally:
            await console.close()
            if not runner.done():
                job.stop(cancel=True)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(runner, 30)
        return run
