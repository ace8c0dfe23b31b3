"""`regen report` on a soak's hour of journals: time and peak memory, against reading the same
journals and doing nothing with them.

    python bench/report.py                  # an hour, 1,000,000 rows (about 3.2M journal records)
    python bench/report.py --rows 100000    # smaller

The run folder is made once (bench/out/report/), as the job writes it (engine/run/records.py's
writers): both fleets (SGLang's GPUs about 60% of the rows, OpenRouter the rest through six
providers), about 3% of attempts failing in eight error classes, an OpenRouter outage of three
minutes with its unsent attempts, platform holds, a pause, a SIGKILL at minute 40 (attempts left
open, then settled at the restart as lost at the crash), bills looked up later (`reconciled`), the
budget raised by the operator, and a deadline. Only the journals: the report reads nothing else.

The command runs as the operator runs it, `regen report RUN_DIR --out ...` in a process of its own;
its peak resident memory is the kernel's high-water mark for that child (getrusage). The baseline,
in the same run: a Python loop that parses every line of both journals with orjson and keeps
nothing, the least any Python reader of them can do. Goal (issue 21): at most 30 s and 500 MB.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from regen.engine.run.records import (  # noqa: E402
    deadline_event,
    end_record,
    gen_record,
    reconciled_record,
    start_event,
    start_record,
)

OUT = ROOT / "bench" / "out" / "report"
HOUR_S = 3600.0
T0 = 1796119200.0
PROVIDERS = ("DeepInfra", "Fireworks", "Together", "Parasail", "Novita", "BaseTen")
SERVERS = ("http://gpu-1:30000", "http://gpu-2:30000")
ERRORS = (
    "rate_limited",
    "network",
    "server_error",
    "mid_stream_error",
    "timeout",
    "provider_error",
    "aborted",
    "overloaded",
)
OUTAGE = (20 * 60.0, 23 * 60.0)  # OpenRouter unreachable, seconds into the hour
KILL_AT = 40 * 60.0  # SIGKILL, then a restart 20 s later
HOLDS = (7 * 60.0, 31 * 60.0, 52 * 60.0)
PAUSE = (45 * 60.0, 46 * 60.0)


def build(rows: int) -> Path:
    """The run folder of an hour that wrote `rows` rows (made once, then reused)."""
    run_dir = OUT / f"run{rows}"
    attempts_path, events_path = run_dir / "attempts.jsonl", run_dir / "events.jsonl"
    if attempts_path.exists() and events_path.exists():
        return run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(21)
    dumps = orjson.dumps
    events: list[dict[str, object]] = []
    backends = ["sglang", "openrouter"]
    events.append(dict(start_event(4242, ["chat"], Decimal(200), Decimal(0), 2000, [], backends, T0)))
    events.append(dict(deadline_event("65m", T0 + 3900, None, "65m", "settings", T0)))
    for at in HOLDS:
        events.append(
            {
                "ts": T0 + at,
                "event": "hold",
                "seconds": 30.0,
                "reason": "429: the account's limit",
                "backend": "openrouter",
            }
        )
        events.append({"ts": T0 + at + 30, "event": "hold_end", "backend": "openrouter"})
    events.append(
        {"ts": T0 + OUTAGE[0], "event": "outage", "reason": "OpenRouter unreachable", "backend": "openrouter"}
    )
    events.append(
        {
            "ts": T0 + OUTAGE[1],
            "event": "outage_end",
            "seconds": OUTAGE[1] - OUTAGE[0],
            "backend": "openrouter",
        }
    )
    events.append({"ts": T0 + 30 * 60, "event": "budget", "value": "250", "source": "console"})
    events.append({"ts": T0 + PAUSE[0], "event": "pause", "source": "console", "backend": "sglang"})
    events.append({"ts": T0 + PAUSE[1], "event": "resume", "source": "console", "backend": "sglang"})
    events.append(
        dict(start_event(4343, ["chat"], Decimal(250), Decimal(90), 2000, [], backends, T0 + KILL_AT + 20))
    )
    events.append(
        {
            "ts": T0 + HOUR_S,
            "event": "end",
            "reason": "operator",
            "message": "stopped",
            "spent": "0",
            "rows": rows,
        }
    )
    events.sort(key=lambda e: float(str(e["ts"])))
    events_path.write_bytes(b"".join(dumps(e) + b"\n" for e in events))

    crashed: list[tuple[str, int, str]] = []  # attempts open at the kill: rid, line, backend
    with open(attempts_path, "wb") as j:
        out: list[bytes] = []
        attempt = 0
        for line in range(rows):
            t = T0 + line * HOUR_S / rows
            second = t - T0
            gpu = rng.random() < 0.6 or OUTAGE[0] <= second < OUTAGE[1]
            if PAUSE[0] <= second < PAUSE[1]:
                gpu = False
            be = "sglang" if gpu else "openrouter"
            tries = 1 + (rng.random() < 0.03)
            for n in range(tries):
                attempt += 1
                rid = f"chat-{line:08d}#{n}"
                e2e = rng.lognormvariate(1.4 if gpu else 1.0, 0.5)
                ttft = e2e * rng.uniform(0.05, 0.2)
                route = rng.choice(SERVERS) if gpu else rng.choice(PROVIDERS)
                reserved = Decimal("0") if gpu else Decimal("0.27")
                out.append(dumps(start_record(rid, "chat", line, reserved, be, t - e2e)))
                if KILL_AT - 2 < second < KILL_AT and line % 50 == 0:
                    crashed.append((rid, line, be))
                    break
                gen = None if gpu else f"gen-{attempt:012d}"
                if gen is not None:
                    out.append(dumps(gen_record(rid, gen)))
                failed = n + 1 < tries
                outcome = rng.choice(ERRORS) if failed else ("truncated" if rng.random() < 0.05 else "ok")
                ctok = rng.randint(100, 900)
                cost = (
                    Decimal(f"{ctok * 12.5:.0f}") / Decimal(10**3)
                    if gpu
                    else Decimal(ctok) * Decimal("0.0000025")
                )
                estimated = not gpu and rng.random() < 0.01
                out.append(
                    dumps(
                        end_record(
                            rid,
                            "chat",
                            line,
                            gen,
                            be,
                            outcome,
                            cost,
                            estimated,
                            t,
                            provider=route,
                            fields={"http": 200} if gpu else {"model": "moonshotai/kimi-k2.5", "http": 200},
                            ptok=40,
                            ctok=ctok,
                            e2e=e2e,
                            ttft=ttft,
                            msg=f"{outcome}: the simulator's fault" if failed else None,
                        )
                    )
                )
                if estimated:
                    billed = cost * Decimal("0.8")
                    out.append(dumps(reconciled_record(rid, be, gen, outcome, billed, billed - cost, t + 2)))
            if OUTAGE[0] <= second < OUTAGE[1] and line % 40 == 0:
                rid = f"chat-{line:08d}#9"
                out.append(dumps(start_record(rid, "chat", line, Decimal("0.27"), "openrouter", t)))
                out.append(
                    dumps(
                        end_record(
                            rid,
                            "chat",
                            line,
                            None,
                            "openrouter",
                            "network",
                            Decimal(0),
                            False,
                            t + 0.01,
                            msg="connect timed out",
                            sent=False,
                        )
                    )
                )
            if abs(second - (KILL_AT + 20)) < HOUR_S / rows:
                for rid, crashed_line, be in crashed:  # settled at the restart (engine/job/settle.py)
                    worst = Decimal(0) if be == "sglang" else Decimal("0.27")
                    out.append(
                        dumps(
                            end_record(
                                rid, "chat", crashed_line, None, be, "lost_at_crash", worst, True, t, ctok=0
                            )
                        )
                    )
            if len(out) > 20000:
                j.write(b"\n".join(out) + b"\n")
                out.clear()
        if out:
            j.write(b"\n".join(out) + b"\n")
    return run_dir


def parse_only(run_dir: Path) -> tuple[float, float]:
    """The baseline: every journal line parsed, nothing kept; (wall seconds, CPU seconds)."""
    started, cpu = time.perf_counter(), time.process_time()
    loads = orjson.loads
    for name in ("attempts.jsonl", "events.jsonl"):
        with open(run_dir / name, "rb") as f:
            for line in f:
                loads(line)
    return time.perf_counter() - started, time.process_time() - cpu


def report(run_dir: Path) -> tuple[float, float, float]:
    """`regen report` in its own process: (wall seconds, CPU seconds, peak RSS in MB).

    The peak is the child's own VmHWM, read from /proc until it exits (the high-water mark only
    grows, so the last reading is the peak within one poll): getrusage's figure for a child counts
    this process's memory too, which the child shares until its exec."""
    out = OUT / "html" / f"{run_dir.name}.html"
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "regen.cli.main", "report", str(run_dir), "--out", str(out)],
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        cwd=OUT,
    )
    peak_kb = 0
    status = Path(f"/proc/{proc.pid}/status")
    while proc.poll() is None:
        try:
            for line in status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak_kb = max(peak_kb, int(line.split()[1]))
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    took = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0, f"regen report exited {proc.returncode}"
    return took, usage.ru_utime + usage.ru_stime, peak_kb / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    made = time.perf_counter()
    run_dir = build(args.rows)
    attempts = run_dir / "attempts.jsonl"
    with open(attempts, "rb") as f:
        records = sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))
    print(
        f"{args.rows:,} rows: {records:,} attempt records ({attempts.stat().st_size / 1e6:.0f} MB), "
        f"ready in {time.perf_counter() - made:.1f} s"
    )
    parse_only(run_dir)  # the page cache, warm for both
    bases = [parse_only(run_dir) for _ in range(args.repeat)]
    base, base_cpu = statistics.median(b[0] for b in bases), statistics.median(b[1] for b in bases)
    cpu_before = 0.0
    runs = []
    for _ in range(args.repeat):
        took, cpu, peak = report(run_dir)
        runs.append((took, cpu - cpu_before, peak))
        cpu_before = cpu  # getrusage sums every child so far
    took = statistics.median(r[0] for r in runs)
    cpu = statistics.median(r[1] for r in runs)
    peak = max(r[2] for r in runs)
    load = os.getloadavg()[0]
    print(f"baseline (orjson over every journal line, nothing kept): {base:.2f} s wall, {base_cpu:.2f} s CPU")
    print(
        f"regen report: {took:.2f} s wall ({took / base:.2f}x the baseline), {cpu:.2f} s CPU "
        f"({cpu / base_cpu:.2f}x the baseline's); goal <= 30 s; peak RSS {peak:.0f} MB (goal <= 500 MB); "
        f"load average {load:.1f} on {os.cpu_count()} CPUs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
