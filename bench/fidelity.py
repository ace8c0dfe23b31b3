"""Provider fidelity (docs/fidelity.md): does the job catch an impostor, leave honest providers be,
and cost nothing that shows?

Two parts, both against the OpenRouter simulator:

- **detection**: 8 honest providers and 1 impostor (the simulator's `impostor_providers`, drift
  `--drift`: lengths x (1 + drift), and that share of its answers run on to the length cap), all at
  the same price so OpenRouter's balancing shares the prompts evenly; `--runs` seeded runs of the
  job with `openrouter.fidelity = "warn"` (nothing excluded, so every provider answers to the end).
  Per run: after how many of its answers the impostor was flagged, and how many honest ones were.
- **throughput**: the job with fingerprints off and on, interleaved, `--repeat` times each, on
  bench/throughput.py's simulator process and pinning; output tokens per wall second and per
  client CPU-second, medians.

    .venv/bin/python bench/fidelity.py              # 20 runs at drift 0.1, then throughput (~12 min on 2 cores)
    .venv/bin/python bench/fidelity.py --runs 3 --repeat 1   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import throughput as tp  # noqa: E402

IMPOSTOR = "impostor"
HONEST = [f"honest{i}" for i in range(8)]


def sim_config(seed: int, drift: float) -> Any:
    from regen.sim.openrouter.catalog import default_models
    from regen.sim.openrouter.config import SimConfig

    model = default_models()[0]
    base = next(ep for ep in model.endpoints if ep.slug == "fireworks")
    model.endpoints = [
        base.model_copy(update={"provider_name": name.capitalize(), "tag": f"{name}/fp8", "ttft_s": 0.5})
        for name in [*HONEST, IMPOSTOR]
    ]
    return SimConfig(
        models=[model],
        time_scale=0.002,
        chunk_interval_s=0.005,
        keepalive_interval_s=0.02,
        generation_lookup_delay_s=0.05,
        min_completion_tokens=64,
        max_completion_tokens=512,
        impostor_providers={IMPOSTOR: drift},
        credits=1e9,
        requests_maxlen=1000,
        seed=seed,
    )


async def detect(seed: int, drift: float, prompts: int, workdir: Path) -> dict[str, Any]:
    """One seeded run; the drift events it journaled."""
    import orjson

    from regen.engine.config.settings import JobSettings, OpenRouterSettings, ProviderSettings, Settings
    from regen.engine.job.job import Job
    from regen.sim.openrouter.server import OpenRouterSim

    sim = OpenRouterSim(sim_config(seed, drift))
    await sim.start()
    try:
        dataset = workdir / "dataset"
        dataset.mkdir(parents=True)
        with open(dataset / "prompts.jsonl", "wb") as f:
            for i in range(prompts):
                message = {"role": "user", "content": f"Run {seed}, question {i}: explain it."}
                f.write(orjson.dumps({"messages": [message]}) + b"\n")
        settings = Settings(
            openrouter=OpenRouterSettings(
                base_url=sim.base_url,
                api_key="sk-sim-test",
                max_tokens=2048,
                provider=ProviderSettings(sort=None),
                fidelity="warn",
            ),
            job=JobSettings(datasets=[dataset], run_dir=workdir / "run", concurrency=64, budget_usd=1e6),
        )
        job = Job(settings)
        await job.prepare()
        await job.run()
        served = {
            name: view["ok"]
            for name, view in ((p["name"], p) for p in job.snapshot()["lanes"][0]["providers"])
        }
    finally:
        await sim.stop()
    events = [orjson.loads(line) for line in (workdir / "run" / "events.jsonl").read_bytes().splitlines()]
    drifts = [e for e in events if e.get("event") == "drift"]
    impostor = [e for e in drifts if e["provider"] == IMPOSTOR.capitalize()]
    return {
        "seed": seed,
        "impostor_flagged_at": impostor[0]["responses"] if impostor else None,
        "impostor_statistic": impostor[0]["statistic"] if impostor else None,
        "honest_flagged": sorted(e["provider"] for e in drifts if e["provider"] != IMPOSTOR.capitalize()),
        "impostor_answers": served.get(IMPOSTOR.capitalize(), 0),
        "honest_answers_min": min(served.get(h.capitalize(), 0) for h in HONEST),
    }


# ------------------------------------------------------------------------------------------ throughput


def child(mode: str, base_url: str, n: int, concurrency: int, workdir: Path, sim_pid: int) -> None:
    """The job in this fresh interpreter with fingerprints `mode` ("off" or "warn"); one JSON line."""
    from regen.engine.runtime import run

    settings_of = tp.regen_settings

    def with_fidelity(
        base_url: str, dataset: Path, run_dir: Path, concurrency: int, stream: bool = True
    ) -> Any:
        settings = settings_of(base_url, dataset, run_dir, concurrency, stream)
        settings.openrouter.fidelity = mode
        return settings

    tp.regen_settings = with_fidelity
    w = tp.Window(sim_pid, None)
    run(tp.run_regen(base_url, n, concurrency, w, workdir))
    print(
        json.dumps(
            {"mode": mode, "tokens": w.tokens, "wall_s": w.wall_s, "cpu_s": w.cpu_s, "errors": w.errors}
        )
    )


def throughput(repeat: int, prompts: int, concurrency: int) -> dict[str, Any]:
    results: dict[str, list[dict[str, Any]]] = {"off": [], "warn": []}
    with tempfile.TemporaryDirectory(prefix="regen-bench-fidelity-") as tmp:
        sim = tp.Sim(Path(tmp))
        try:
            for k in range(repeat):
                for mode in ("off", "warn") if k % 2 == 0 else ("warn", "off"):
                    workdir = Path(tmp) / f"{mode}-{k}"
                    cmd = [
                        sys.executable,
                        str(Path(__file__).resolve()),
                        "--child",
                        mode,
                        "--base-url",
                        sim.base_url,
                        "--prompts",
                        str(prompts),
                        "--concurrency",
                        str(concurrency),
                        "--workdir",
                        str(workdir),
                        "--sim-pid",
                        str(sim.proc.pid),
                    ]
                    done = subprocess.run(
                        cmd,
                        cwd=ROOT,
                        capture_output=True,
                        text=True,
                        timeout=900,
                        preexec_fn=tp._pin(tp.CLIENT_CPU),
                    )
                    if done.returncode != 0:
                        raise SystemExit(f"{mode} child failed:\n{done.stderr[-3000:]}")
                    results[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
        finally:
            sim.stop()
    out: dict[str, Any] = {}
    for mode, runs in results.items():
        out[mode] = {
            "tok_per_s": statistics.median(r["tokens"] / r["wall_s"] for r in runs),
            "tok_per_cpu_s": statistics.median(r["tokens"] / r["cpu_s"] for r in runs),
            "runs": [round(r["tokens"] / r["wall_s"]) for r in runs],
        }
    out["ratio_wall"] = out["warn"]["tok_per_s"] / out["off"]["tok_per_s"]
    out["ratio_cpu"] = out["warn"]["tok_per_cpu_s"] / out["off"]["tok_per_cpu_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--drift", type=float, default=0.1)
    ap.add_argument(
        "--detect-prompts", type=int, default=4500, help="prompts per detection run (~500 per provider)"
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=4000, help="prompts per throughput run")
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--child", choices=("off", "warn"), help=argparse.SUPPRESS)
    ap.add_argument("--base-url", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--sim-pid", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.base_url, args.prompts, args.concurrency, args.workdir, args.sim_pid)
        return 0
    from regen.engine.runtime import run

    started = time.monotonic()
    rows = []
    for seed in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory(prefix="regen-bench-fidelity-") as tmp:
            row = run(detect(seed, args.drift, args.detect_prompts, Path(tmp)))
        rows.append(row)
        print(json.dumps(row), flush=True)
    flagged = [r["impostor_flagged_at"] for r in rows]
    caught = sum(1 for f in flagged if f is not None and f <= 300)
    honest = sum(len(r["honest_flagged"]) for r in rows)
    print(
        f"\ndetection, drift {args.drift}: impostor flagged within 300 of its answers in {caught}/{len(rows)} runs "
        f"(at {sorted(f for f in flagged if f is not None)}; statistics "
        f"{sorted({r['impostor_statistic'] for r in rows if r['impostor_statistic']})}); "
        f"honest providers flagged: {honest} in {len(rows)} runs; {time.monotonic() - started:.0f} s"
    )
    if not args.skip_throughput:
        result = throughput(args.repeat, args.prompts, args.concurrency)
        print(
            f"throughput, fingerprints on / off: {result['ratio_wall']:.3f} per wall second "
            f"({result['warn']['runs']} against {result['off']['runs']} tok/s), "
            f"{result['ratio_cpu']:.3f} per client CPU-second"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
