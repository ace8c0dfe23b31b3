"""The two-fleet job for real: `regen run --headless` against both simulators, scaled down in time.

The story's case (the two-fleet job of docs/fleets.md; bench/fleet_plan.py plans it at full size): 60M output tokens over 6
datasets, a GPU fleet at about 1,000 tokens/s that makes 72% of the work by a 12-hour deadline,
OpenRouter from $2.20/M for the rest, $100 of budget. Here the same proportions in minutes: the
GPUs (`regen sim sglang`, its own process) make `--gpu-tokens-per-s` (nominal: max_running x
decode rate / time_scale), the work is sized so that they make 72% of it by `--deadline-s`, the
budget is the story's $100 per 60M tokens of work, and OpenRouter (`regen sim openrouter`, its own
process, the simulator's catalogue from $2.20/M) carries the rest. The job is the real one, a
process of its own, with the deadline control in it (engine/job/deadline_control.py).

Two runs on fresh simulators and run folders:
- paced: `job.deadline` set; the claim is that it finishes within 10% of the deadline, never
  past the budget;
- flat out (the baseline in the same run): no deadline, both fleets as fast as they go; it finishes
  early and buys more of the work from OpenRouter. The ratio of the two runs' dollars is the saving.

    .venv/bin/python bench/fleet_run.py               # about 5 minutes
    .venv/bin/python bench/fleet_run.py --write-md    # also update BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.throughput import machine, revision, write_md  # noqa: E402 - the sibling benchmark's helpers
from regen.engine.run.recovery import read_journals  # noqa: E402
from regen.sim.sglang.tokens import builtin_tokenizer_folder  # noqa: E402
from tests.support.journals import journal  # noqa: E402
from tests.support.processes import free_port  # noqa: E402

MD_START = "<!-- bench:fleet-run:start -->"
MD_END = "<!-- bench:fleet-run:end -->"
OUT = ROOT / "bench" / "out" / "fleet_run"
KEY = "sk-or-v1-bench-fleet-run"
DATASETS = 6
TOKENS = (60, 140)  # output tokens of an answer, both simulators: mean 100
GPU_SHARE = 43.2 / 60  # what the GPUs make by the deadline in the story
BUDGET_PER_TOKEN = 100 / 60e6  # the story's $100 for 60M tokens of work
RUNNING = 8  # requests the GPU simulator decodes at once
DECODE = 40.0  # tokens/s of one request on the GPU simulator, before time_scale


@dataclass
class Result:
    name: str
    deadline_s: float | None
    finished_s: float
    gpu_tokens: int
    openrouter_tokens: int
    gpu_rows: int
    openrouter_rows: int
    spent: Decimal
    billed: Decimal
    budget: float
    plan: dict[str, Any] | None
    ceiling_moves: int


def make_datasets(root: Path, prompts: int) -> list[Path]:
    folders = []
    for d in range(DATASETS):
        folder = root / f"set{d}"
        folder.mkdir(parents=True)
        count = prompts // DATASETS + (1 if d < prompts % DATASETS else 0)
        lines = (
            orjson.dumps(
                {"messages": [{"role": "user", "content": f"set {d} question {i}: explain topic {i % 97}."}]}
            )
            for i in range(count)
        )
        (folder / "prompts.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
        folders.append(folder)
    return folders


def start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    ends = time.monotonic() + timeout_s
    while time.monotonic() < ends:
        if proc.poll() is not None:
            raise SystemExit(f"a simulator exited ({proc.returncode}) before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"no answer from {url} in {timeout_s:.0f} s")


def one_run(
    name: str,
    args: argparse.Namespace,
    deadline_s: float | None,
    prompts: int,
    budget: float,
    *,
    out: Path = OUT,
    during: Callable[[subprocess.Popen[bytes], subprocess.Popen[bytes]], None] | None = None,
) -> Result:
    """One job on fresh simulators in `out`/`name`; `during(gpu, job)` runs while the job does (a
    fault staged on the GPU simulator's process: bench/fleet_stall.py)."""
    folder = out / name
    folder.mkdir(parents=True)
    tokenizer = builtin_tokenizer_folder(folder / "tokenizer")
    datasets = make_datasets(folder / "datasets", prompts)
    time_scale = RUNNING * DECODE / args.gpu_tokens_per_s
    gpu_port, paid_port = free_port(), free_port()
    (folder / "gpu.json").write_text(
        json.dumps(
            {
                "served_model_name": "kimi-k2.5",
                "startup_weights_s": 0.0,
                "startup_kv_pool_s": 0.0,
                "startup_cuda_graph_s": 0.0,
                "startup_http_s": 0.0,
                "startup_warmup_s": 0.0,
                "max_running_requests": RUNNING,
                "decode_tokens_per_s": DECODE,
                "output_len_min": TOKENS[0],
                "output_len_max": TOKENS[1],
                "child_processes": 0,
                "time_scale": time_scale,
                "seed": args.seed,
            }
        )
    )
    (folder / "openrouter.json").write_text(
        json.dumps(
            {
                "api_keys": [KEY],
                "time_scale": args.openrouter_time_scale,
                "min_completion_tokens": TOKENS[0],
                "max_completion_tokens": TOKENS[1],
                "seed": args.seed,
            }
        )
    )
    deadline = f'deadline = "{int(deadline_s)}s"\n' if deadline_s is not None else ""
    settings = folder / "settings.toml"
    settings.write_text(
        f'[openrouter]\nbase_url = "http://127.0.0.1:{paid_port}/api/v1"\nmax_tokens = 256\n'
        f'[sglang]\nurls = ["http://127.0.0.1:{gpu_port}"]\nserved_model_name = "kimi-k2.5"\nmetrics_interval_s = 1.0\n'
        f"[tokenizer]\npath = {json.dumps(str(tokenizer))}\nworkers = 1\n"
        f'[job]\nbackends = ["sglang", "openrouter"]\ndatasets = {json.dumps([str(f) for f in datasets])}\n'
        f"run_dir = {json.dumps(str(folder / 'run'))}\nconcurrency = {args.concurrency}\nbudget_usd = {budget}\n{deadline}"
        f"[steering]\ngpu_tokens_per_s = {args.gpu_tokens_per_s}\ninterval_s = {args.interval_s}\n"
        f"smoothing_s = {args.smoothing_s}\n"
        f"[stats]\nexpected_output_tokens = {sum(TOKENS) // 2}\n"
        "[headless]\nstatus_interval_s = 10.0\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OPENROUTER_API_KEY": KEY}
    regen = [sys.executable, "-m", "regen.cli.main"]
    gpu = start(
        [
            *regen,
            "sim",
            "sglang",
            "--port",
            str(gpu_port),
            "--config",
            str(folder / "gpu.json"),
            "--tokenizer",
            str(tokenizer),
        ],
        env,
        folder / "gpu.log",
    )
    paid = start(
        [*regen, "sim", "openrouter", "--port", str(paid_port), "--config", str(folder / "openrouter.json")],
        env,
        folder / "openrouter.log",
    )
    try:
        wait_http(f"http://127.0.0.1:{gpu_port}/health", gpu)
        wait_http(f"http://127.0.0.1:{paid_port}/_sim/ledger", paid)
        print(
            f"{name}: {prompts:,} prompts, GPUs {args.gpu_tokens_per_s:,.0f} tok/s nominal, budget ${budget:.4f}"
            + (f", deadline {deadline_s:.0f} s" if deadline_s else ", no deadline"),
            flush=True,
        )
        with (folder / "job.log").open("wb") as log:
            job = subprocess.Popen(
                [*regen, "run", "--headless", "--settings", str(settings)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                if during is not None:
                    during(gpu, job)
                code = job.wait(timeout=args.deadline_s * 5)
            finally:
                if job.poll() is None:
                    job.kill()
                    job.wait()
        if code != 0:
            raise SystemExit(f"{name}: the job exited {code}; see {folder / 'job.log'}")
        with urllib.request.urlopen(f"http://127.0.0.1:{paid_port}/_sim/ledger", timeout=30) as response:
            billed = Decimal(json.loads(response.read())["billed_total"])
    finally:
        for proc in (gpu, paid):
            proc.send_signal(signal.SIGCONT)  # a stalled simulator must run to stop
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    events = journal(folder / "run" / "events.jsonl")
    began = next(e["ts"] for e in events if e["event"] == "start")
    ended = next(e["ts"] for e in reversed(events) if e["event"] == "end")
    plan = next((e["plan"] for e in events if e["event"] == "fleet_plan"), None)
    tokens = {"sglang": 0, "openrouter": 0}
    rows = {"sglang": 0, "openrouter": 0}
    for dataset in datasets:
        for line in (dataset / "raw_responses.jsonl").read_bytes().splitlines():
            row = orjson.loads(line)
            rows[row["backend"]] += 1
            tokens[row["backend"]] += row["usage"]["completion_tokens"]
    money = read_journals(
        folder / "run" / "attempts.jsonl", folder / "run" / "events.jsonl", backend="openrouter"
    )
    return Result(
        name,
        deadline_s,
        ended - began,
        tokens["sglang"],
        tokens["openrouter"],
        rows["sglang"],
        rows["openrouter"],
        money.spent,
        billed,
        budget,
        plan,
        sum(1 for e in events if e["event"] == "steer"),  # a ceiling move's event (docs/fleets.md)
    )


def arguments(description: str, deadline_s: float = 150.0, concurrency: int = 64) -> argparse.ArgumentParser:
    """The options of a two-fleet run (this benchmark's and bench/fleet_stall.py's)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--deadline-s", type=float, default=deadline_s)
    parser.add_argument("--gpu-tokens-per-s", type=float, default=800.0)
    parser.add_argument("--openrouter-time-scale", type=float, default=0.5)
    parser.add_argument("--concurrency", type=int, default=concurrency, help="per lane")
    parser.add_argument("--interval-s", type=float, default=2.0, help="steering.interval_s")
    parser.add_argument("--smoothing-s", type=float, default=10.0, help="steering.smoothing_s")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--write-md", action="store_true")
    return parser


def sized(args: argparse.Namespace) -> tuple[int, float]:
    """The prompts and the budget of the story's job at `args`' GPU rate and deadline."""
    work = args.gpu_tokens_per_s * args.deadline_s / GPU_SHARE
    return int(work / (sum(TOKENS) / 2)), round(work * BUDGET_PER_TOKEN, 6)


def main() -> int:
    args = arguments(__doc__.split("\n\n")[0]).parse_args()
    began = time.monotonic()
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    prompts, budget = sized(args)
    paced = one_run("paced", args, args.deadline_s, prompts, budget)
    flat = one_run("flat-out", args, None, prompts, budget)
    lines = [
        "| run | deadline | finished | / deadline | GPU tokens (rows) | OpenRouter tokens (rows) | plan at start: OpenRouter tokens, $ | spent $ | billed $ | budget $ | ceiling moves |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in (paced, flat):
        ratio = f"{r.finished_s / args.deadline_s:.3f}"
        plan = "-" if r.plan is None else f"{r.plan['openrouter_tokens']:,}, {r.plan['cost']:.4f}"
        lines.append(
            f"| {r.name} | {'-' if r.deadline_s is None else f'{r.deadline_s:.0f} s'} | {r.finished_s:.1f} s | {ratio} | "
            f"{r.gpu_tokens:,} ({r.gpu_rows:,}) | {r.openrouter_tokens:,} ({r.openrouter_rows:,}) | {plan} | "
            f"{r.spent:.4f} | {r.billed:.4f} | {r.budget:.4f} | {r.ceiling_moves} |"
        )
    within = abs(paced.finished_s / args.deadline_s - 1) <= 0.10
    honest = all(r.spent <= Decimal(str(r.budget)) for r in (paced, flat))
    saving = float(paced.spent / flat.spent) if flat.spent else float("nan")
    verdict = [
        f"Paced: finished at {paced.finished_s / args.deadline_s:.1%} of the deadline (within 10%: "
        f"{'holds' if within else 'MISSED'}); spent ${paced.spent:.4f} of ${paced.budget:.4f}, "
        f"{saving:.2f} of what the flat-out run spent (${flat.spent:.4f}), which finished at "
        f"{flat.finished_s / args.deadline_s:.1%} of the deadline. Never past the budget: {'holds' if honest else 'BROKEN'}.",
    ]
    text = "\n".join([*lines, "", *verdict])
    print(text)
    if args.write_md:
        header = (
            f"Run {time.strftime('%Y-%m-%d')} on revision {revision()}: `.venv/bin/python bench/fleet_run.py --write-md` "
            f"({time.monotonic() - began:.0f} s).\n\nMachine: {machine()}.\n"
            f"{prompts:,} prompts over {DATASETS} datasets, answers of {TOKENS[0]}-{TOKENS[1]} tokens on both simulators; "
            f"GPUs {args.gpu_tokens_per_s:,.0f} tok/s nominal ({RUNNING} running x {DECODE:.0f} tok/s, time_scale "
            f"{RUNNING * DECODE / args.gpu_tokens_per_s:.2f}), so they make {GPU_SHARE:.0%} of the work by the deadline; "
            f"OpenRouter simulator time_scale {args.openrouter_time_scale}, {args.concurrency} in flight per lane at most; "
            f"pacing every {args.interval_s:g} s, smoothing {args.smoothing_s:g} s.\n\n"
        )
        write_md(header + text, MD_START, MD_END, heading="Both fleets, one deadline: the real job")
    return 0 if within and honest else 1


if __name__ == "__main__":
    sys.exit(main())
