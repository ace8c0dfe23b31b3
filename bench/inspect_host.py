"""`regen inspect` of a 1,000,000-line dataset over loopback SSH, against `wc -l` + `sha256sum` over SSH.

    python bench/inspect_host.py                      # 1,000,000 lines, 3 rounds, ratio printed
    python bench/inspect_host.py --lines 200000       # smaller
    python bench/inspect_host.py --data DIR           # keep (and reuse) the generated dataset in DIR
    python bench/inspect_host.py --host-python /usr/bin/python3   # the host's Python without orjson

Both sides run against the same real OpenSSH server (tests/support/sshd.py: a throw-away sshd on a
loopback port with its own keys), on the same file, with the page cache warm, in the same run,
alternating which goes first. The baseline is OpenSSH's own client running
``wc -l FILE; sha256sum FILE``: one login, two C tools reading the file. regen's side is the whole
command as an operator runs it, ``regen inspect --json`` in a fresh process: settings, one login,
the scripts shipped on stdin, every line validated on the host (in parallel workers there), the
GPU, disk and model probes, JSON out. Reported: wall seconds (median of the rounds), the ratio,
and the host-side survey's own seconds and worker count; then, in this process without SSH, the
survey with one worker and the job's own ``scan`` for reference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from regen.engine.config.settings import HostSettings  # noqa: E402
from regen.engine.data.datasets import Dataset  # noqa: E402
from regen.engine.data.scan import scan  # noqa: E402
from regen.engine.host.scripts.survey import default_workers, survey  # noqa: E402
from tests.support.hosts import write_settings  # noqa: E402
from tests.support.sshd import make_server  # noqa: E402

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "been",
    "one",
    "all",
    "we",
    "their",
    "has",
    "would",
    "when",
    "if",
    "so",
    "no",
    "will",
    "more",
    "can",
    "said",
    "who",
    "model",
    "explain",
    "routing",
    "tokens",
    "experts",
    "gradient",
    "attention",
    "layer",
    "batch",
    "cache",
    "kernel",
    "latency",
    "throughput",
    "prompt",
]


def make_dataset(path: Path, lines: int, seed: int = 1) -> None:
    """Chat prompts of 1-5 turns, some with a system message, ~2% duplicates and a few bad lines."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    recent: list[str] = []
    with open(path, "w", encoding="utf-8") as out:
        for i in range(lines):
            r = rng.random()
            if r < 0.0005:
                out.write(
                    rng.choice(
                        ['{"messages": []}', "{oops", '{"messages": [{"role": "bot", "content": "x"}]}']
                    )
                    + "\n"
                )
                continue
            if r < 0.02 and recent:
                out.write(rng.choice(recent) + "\n")
                continue
            msgs = []
            if rng.random() < 0.3:
                msgs.append({"role": "system", "content": " ".join(rng.choices(WORDS, k=rng.randint(5, 20)))})
            for t in range(rng.choice((1, 1, 1, 2, 3))):
                if t:
                    msgs.append(
                        {"role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randint(10, 60)))}
                    )
                msgs.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(5, 80)))})
            text = json.dumps({"messages": msgs}, ensure_ascii=False)
            out.write(text + "\n")
            if i % 97 == 0:
                recent = [*recent[-50:], text]


def shell_seconds(word: str) -> float:
    """``0m1.950s`` (as the shell's ``times`` prints it) in seconds."""
    minutes, _, seconds = word.rstrip("s").partition("m")
    return int(minutes) * 60 + float(seconds)


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    began = time.perf_counter()
    done = subprocess.run(
        argv, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, check=False
    )
    took = time.perf_counter() - began
    if done.returncode not in (0,):
        raise SystemExit(f"{argv[0]} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return took, done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data", type=Path, default=None, help="folder for the dataset (kept and reused)")
    parser.add_argument(
        "--host-python", default=sys.executable, help="the Python the host runs regen's scripts with"
    )
    parser.add_argument("--no-local", action="store_true", help="skip the in-process reference rows")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="regen-bench-inspect-") as tmp_name:
        tmp = Path(tmp_name)
        data_root = (args.data or tmp / "data").resolve()
        prompts = data_root / "bench" / "prompts.jsonl"
        marker = data_root / "bench" / f".made-{args.lines}"
        if not marker.exists():
            print(f"writing {args.lines:,} lines to {prompts} ...", flush=True)
            make_dataset(prompts, args.lines)
            marker.write_text("")
        size = prompts.stat().st_size
        with open(prompts, "rb") as f:  # warm the page cache for both sides
            sha = hashlib.sha256(f.read()).hexdigest()

        server = make_server(tmp / "sshd")
        server.start()
        try:
            known = server.write_known_hosts(tmp / "known_hosts")
            host = HostSettings(
                name="bench",
                address="127.0.0.1",
                port=server.port,
                user=server.user,
                key_files=[server.client_key],
                known_hosts=known,
                data_root=str(data_root),
                python=args.host_python,
            )
            settings = write_settings(tmp / "settings.toml", [host], tmp / "ws")
            env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
            regen_cmd = [
                sys.executable,
                "-m",
                "regen.cli.main",
                "inspect",
                "--json",
                "--settings",
                str(settings),
            ]
            ssh_cmd = [
                "ssh", "-p", str(server.port), "-i", str(server.client_key),
                "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                f"{server.user}@127.0.0.1",
                # `times` (a shell builtin, free) prints the CPU the two tools used, for the CPU ratio.
                f"wc -l {shlex.quote(str(prompts))}; sha256sum {shlex.quote(str(prompts))}; times",
            ]  # fmt: skip
            base_times: list[float] = []
            regen_times: list[float] = []
            host_seconds: list[float] = []
            base_cpu: list[float] = []
            regen_cpu: list[float] = []
            workers = 0
            for r in range(args.repeat):
                order = ("ssh", "regen") if r % 2 == 0 else ("regen", "ssh")
                for which in order:
                    if which == "ssh":
                        took, out = timed(ssh_cmd)
                        words = out.split()
                        assert int(words[0]) == args.lines and words[2] == sha, out
                        base_times.append(took)
                        base_cpu.append(sum(shell_seconds(w) for w in out.splitlines()[-1].split()))
                    else:
                        took, out = timed(regen_cmd, env)
                        record = json.loads(out)["hosts"][0]["datasets"][0]
                        assert record["lines"] == args.lines and record["sha256"] == sha
                        host_seconds.append(record["seconds"])
                        regen_cpu.append(record["cpu_seconds"])
                        workers = record["workers"]
                        regen_times.append(took)
                print(
                    f"round {r + 1}: ssh wc+sha256sum {base_times[-1]:.2f} s, regen inspect {regen_times[-1]:.2f} s",
                    flush=True,
                )
        finally:
            server.stop()

        base, ours = statistics.median(base_times), statistics.median(regen_times)
        print()
        print(
            f"dataset: {args.lines:,} lines, {size / 1e6:.0f} MB; host python {args.host_python}; {os.cpu_count()} CPUs"
        )
        print(f"ssh 'wc -l; sha256sum'   {base:6.2f} s  (median of {len(base_times)})")
        print(f"regen inspect --json     {ours:6.2f} s  (median of {len(regen_times)}; survey on the host "
              f"{statistics.median(host_seconds):.2f} s with {workers} workers)")  # fmt: skip
        print(f"ratio                    {ours / base:6.2f} x  (goal: at most 3.00)")
        cpu_base, cpu_ours = statistics.median(base_cpu), statistics.median(regen_cpu)
        print(f"host CPU for the file: wc+sha256sum {cpu_base:.2f} s, regen's survey {cpu_ours:.2f} s "
              f"({cpu_ours / cpu_base:.2f} x; what a busier or quieter machine changes least)")  # fmt: skip
        if not args.no_local:
            t = time.perf_counter()
            survey(str(prompts), workers=1)
            one = time.perf_counter() - t
            t = time.perf_counter()
            survey(str(prompts), workers=default_workers())
            many = time.perf_counter() - t
            t = time.perf_counter()
            scan(Dataset("bench", prompts.parent))
            job_scan = time.perf_counter() - t
            print(f"in process, no SSH: survey 1 worker {one:.2f} s, {default_workers()} workers {many:.2f} s; "
                  f"the job's scan {job_scan:.2f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
