"""What /metrics costs the job: the same run with the page scraped every second and without it.

The claim (docs/metrics.md): with `/metrics` served and scraped every second at 2000 in flight, the
job's output throughput is at least 0.98 of the same run without it.

Method, as bench/throughput.py's (whose simulator, profile, job settings and timed window this
reuses): the OpenRouter simulator in its own process pinned to one core, the job in a fresh
interpreter (this file with `--child VARIANT`) on uvloop pinned to the other, a fresh simulator per
run, both variants over the same prompts at the same concurrency, each taking a folded snapshot every
half second as an attached console would. "regen-metrics" also serves `[metrics] listen` (the job's
own server, engine/control/headless.py `open_metrics`), and a scraper process (pinned to the
simulator's core, as Prometheus would be on another machine) GETs /metrics every second through the
run. The variants alternate (ABBA...) and the median of each is taken; the ratio is of the medians.
Beside it: the scrapes made, the page's size, and the job's own time rendering a scrape (collect and
encode, measured in the job's process), as a share of the run's wall time: the cost with the noise
of a shared machine taken out.

    .venv/bin/python bench/metrics.py                 # 2000 in flight, 5 rounds of each (~2 min quiet)
    .venv/bin/python bench/metrics.py --quick         # a smoke run
    .venv/bin/python bench/metrics.py --write-md      # also update BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.throughput import (  # noqa: E402 - the sibling benchmark's helpers
    CLIENT_CPU,
    SIM_CPU,
    SIM_PROFILE,
    Sim,
    Window,
    _pin,
    drive,
    machine,
    regen_settings,
    revision,
    versions,
    write_md,
    write_prompts,
)
from tests.support.processes import free_port  # noqa: E402

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

VARIANTS = ("regen", "regen-metrics")
MD_START = "<!-- bench:metrics:start -->"
MD_END = "<!-- bench:metrics:end -->"
BAR = 0.98

# The scraper: GET /metrics every second until SIGTERM, then one JSON line of what it saw.
SCRAPER = r"""
import json, signal, sys, time, urllib.request
url, stop, seen = sys.argv[1], [], {"scrapes": 0, "failed": 0, "bytes": 0, "seconds": []}
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
next_at = time.monotonic()
while not stop:
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = resp.read()
        seen["scrapes"] += 1
        seen["bytes"] = len(body)
        seen["seconds"].append(time.monotonic() - t0)
    except OSError:
        seen["failed"] += 1
    next_at += 1.0
    time.sleep(max(0.0, next_at - time.monotonic()))
print(json.dumps(seen), flush=True)
"""


async def run_job(
    base_url: str, n: int, concurrency: int, w: Window, workdir: Path, metrics: bool
) -> dict[str, Any]:
    """The job as bench/throughput.py runs it; with `metrics`, serving /metrics while a scraper reads it."""
    from prometheus_client import exposition

    from regen.engine.config.settings import MetricsSettings
    from regen.engine.control.headless import open_metrics
    from regen.engine.job.job import Job

    dataset = workdir / "dataset"
    dataset.mkdir(parents=True)
    write_prompts(dataset / "prompts.jsonl", n)
    settings = regen_settings(base_url, dataset, workdir / "run", concurrency)
    port = free_port()
    if metrics:
        settings.metrics = MetricsSettings(listen=f"127.0.0.1:{port}")
    job = Job(settings)
    await job.prepare()
    rendering: list[float] = []  # the job's own seconds per scrape: collect and encode
    rendering_cpu: list[
        float
    ] = []  # ... in CPU seconds of the loop's thread (what other work cannot inflate)
    real_choose = exposition.choose_encoder

    def timed_choose(accept_header: str) -> tuple[Callable[[Collector], bytes], str]:
        encode, content_type = real_choose(accept_header)

        def timed(registry: Collector) -> bytes:
            t0, c0 = time.perf_counter(), time.thread_time()
            body = encode(registry)
            rendering.append(time.perf_counter() - t0)
            rendering_cpu.append(time.thread_time() - c0)
            return body

        return timed, content_type

    exposition.choose_encoder = (
        timed_choose  # what the job's server calls per scrape, timed (this child only)
    )
    server = await open_metrics(job, io.StringIO())
    scraper = None
    if metrics:
        assert server is not None, "the metrics server did not start"
        scraper = subprocess.Popen(
            [sys.executable, "-c", SCRAPER, f"http://127.0.0.1:{port}/metrics"],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=_pin(SIM_CPU),
        )
    try:
        await drive(job, w)
    finally:
        seen: dict[str, Any] = {}
        if scraper is not None:
            scraper.send_signal(signal.SIGTERM)
            out, _ = scraper.communicate(timeout=30)
            seen = json.loads(out.strip().splitlines()[-1])
        if server is not None:
            await server.close()
    return {
        "scrapes": seen.get("scrapes", 0),
        "scrape_failed": seen.get("failed", 0),
        "page_bytes": seen.get("bytes", 0),
        "scrape_latency_s": statistics.median(seen["seconds"]) if seen.get("seconds") else None,
        "render_s": sum(rendering),
        "render_cpu_s": sum(rendering_cpu),
        "render_max_s": max(rendering, default=0.0),
        "renders": len(rendering),
    }


def child(variant: str, base_url: str, n: int, concurrency: int, workdir: Path, sim_pid: int | None) -> None:
    from regen.engine.runtime import run

    w = Window(sim_pid, None)
    extra = run(run_job(base_url, n, concurrency, w, workdir, variant == "regen-metrics"))
    print(
        json.dumps(
            {
                "variant": variant,
                "concurrency": concurrency,
                "prompts": n,
                "tokens": w.tokens,
                "requests": w.requests,
                "errors": w.errors,
                "first_error": w.first_error,
                "wall_s": w.wall_s,
                "cpu_s": w.cpu_s,
                "sim_cpu_s": w.sim_cpu_s,
                **extra,
            }
        ),
        flush=True,
    )


def run_child(variant: str, sim: Sim, n: int, concurrency: int, workdir: Path) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        variant,
        "--base-url",
        sim.base_url,
        "--prompts",
        str(n),
        "--concurrency",
        str(concurrency),
        "--workdir",
        str(workdir),
        "--sim-pid",
        str(sim.proc.pid),
    ]
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200, preexec_fn=_pin(CLIENT_CPU)
    )
    if proc.returncode != 0:
        raise SystemExit(f"{variant} child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=2000)
    ap.add_argument("--prompts", type=int, default=None, help="prompts per run (default 10 x concurrency)")
    ap.add_argument("--rounds", type=int, default=5, help="runs of each variant (median taken)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 200 in flight, 2000 prompts, 1 round")
    ap.add_argument("--write-md", action="store_true", help="update the metrics section of BENCHMARKS.md")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--base-url", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--sim-pid", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.base_url, args.prompts, args.concurrency, args.workdir, args.sim_pid)
        return 0
    c, rounds = (200, 1) if args.quick else (args.concurrency, args.rounds)
    n = args.prompts or (2000 if args.quick else 10 * c)

    tmp = Path(tempfile.mkdtemp(prefix="regen-bench-metrics-"))
    started = time.monotonic()
    load0 = os.getloadavg()[0]
    print(f"machine: {machine()}; load average {load0:.2f}")
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    try:
        for k in range(rounds):
            order = (
                VARIANTS if k % 2 == 0 else VARIANTS[::-1]
            )  # ABBA: a drift in the machine's load hits both
            for v in order:
                work = tmp / f"{v}-{k}"
                work.mkdir()
                sim = Sim(work)
                try:
                    r = run_child(v, sim, n, c, work)
                finally:
                    sim.stop()
                    shutil.rmtree(work, ignore_errors=True)
                results[v].append(r)
                print(
                    f"  round {k + 1}/{rounds} {v:14s} {r['tokens'] / r['wall_s']:>10,.0f} tok/s  wall {r['wall_s']:5.1f} s"
                    f"  {r['tokens'] / max(r['cpu_s'], 1e-9):>10,.0f} tok/CPU-s"
                    f"  scrapes {r['scrapes']}  render {1000 * r['render_s'] / max(r['renders'], 1):.1f} ms each"
                    + (f"  {r['errors']} errors (first: {r['first_error']})" if r["errors"] else ""),
                    flush=True,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.monotonic() - started
    load_note = f"load average {load0:.2f} before the run, {os.getloadavg()[0]:.2f} after"

    tps = {v: [r["tokens"] / r["wall_s"] for r in results[v]] for v in VARIANTS}
    med = {v: statistics.median(tps[v]) for v in VARIANTS}
    ratio = med["regen-metrics"] / med["regen"]
    # Tokens per CPU-second of the job's process: what a shared machine's other work moves least.
    per_cpu = {
        v: statistics.median(r["tokens"] / max(r["cpu_s"], 1e-9) for r in results[v]) for v in VARIANTS
    }
    served = results["regen-metrics"]
    scrapes = sum(r["scrapes"] for r in served)
    failed = sum(r["scrape_failed"] for r in served)
    renders = sum(r["renders"] for r in served)
    render_s = sum(r["render_s"] for r in served)
    wall = sum(r["wall_s"] for r in served)
    page_kb = max(r["page_bytes"] for r in served) / 1024
    render_cpu = sum(r["render_cpu_s"] for r in served)
    job_cpu = sum(r["cpu_s"] for r in served)
    latency = (
        statistics.median(r["scrape_latency_s"] for r in served if r["scrape_latency_s"] is not None)
        if scrapes
        else None
    )
    errors = sum(r["errors"] for v in VARIANTS for r in results[v])
    lines = [
        "| variant | output tok/s (median) | each run | wall s (median) | tok per job CPU-s (median) | sim CPU % (median) |",
        "|---|---:|---|---:|---:|---:|",
        *(
            f"| {v} | {med[v]:,.0f} | {', '.join(f'{x / 1e3:,.0f}k' for x in tps[v])} "
            f"| {statistics.median(r['wall_s'] for r in results[v]):.1f} | {per_cpu[v]:,.0f} "
            f"| {statistics.median(100 * r['sim_cpu_s'] / r['wall_s'] for r in results[v]):.0f}% |"
            for v in VARIANTS
        ),
        "",
        f"- regen-metrics / regen = **{ratio:.3f}** ({'meets' if ratio >= BAR else 'BELOW'} the {BAR} bar); "
        f"per job CPU-second {per_cpu['regen-metrics'] / per_cpu['regen']:.3f}.",
        f"- {scrapes} scrapes over {wall:.0f} s of runs ({failed} failed), a page of {page_kb:.1f} KiB, "
        + (f"median scrape {1000 * latency:.1f} ms end to end; " if latency is not None else "")
        + f"the job rendered each in {1000 * render_s / max(renders, 1):.2f} ms on average "
        f"(longest {1000 * max(r['render_max_s'] for r in served):.2f} ms): "
        f"{100 * render_s / max(wall, 1e-9):.2f}% of the job's wall time; in CPU time "
        f"{1000 * render_cpu / max(renders, 1):.2f} ms a scrape, **{100 * render_cpu / max(job_cpu, 1e-9):.2f}% of the "
        "job's CPU** (the loop's thread rendering, against the whole process's CPU seconds).",
    ]
    if errors:
        lines.append(
            f"- {errors} failed requests (first: {next(r['first_error'] for v in VARIANTS for r in results[v] if r['first_error'])})"
        )
    verdict = f"Claim {'holds' if ratio >= BAR and not errors else 'does NOT hold'} in this run."
    print("\n".join(["", *lines, "", verdict, f"(benchmark took {elapsed:.0f} s; {load_note})"]))
    if args.write_md:
        given = sys.argv[1:] if argv is None else argv
        cmd = ".venv/bin/python bench/metrics.py" + "".join(f" {a}" for a in given)
        write_md(
            "\n".join(
                [
                    f"Run {dt.date.today().isoformat()} on revision {revision()}: `{cmd}` ({elapsed:.0f} s).",
                    "",
                    f"Machine: {machine()}; {versions()}; {load_note}.",
                    f"Simulator: bench/throughput.py's profile {json.dumps(SIM_PROFILE)}; {n} prompts per run at "
                    f"concurrency {c}; {rounds} round(s) of each variant, alternating, median of output tokens/s.",
                    "",
                    *lines,
                    "",
                    verdict,
                ]
            ),
            MD_START,
            MD_END,
            "Metrics: what a scrape of /metrics every second costs the job",
        )
    return 0 if ratio >= BAR and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
