"""`regen demo`: the real job against the built-in OpenRouter simulator and the bundled sample.

No key, no host, no money: the simulator runs in the same process on a loopback port, with a few
providers of different speeds and a light sprinkle of faults, so retries and the budget show.
`regen demo --backend sglang` rehearses the SGLang path instead: the SGLang simulator with the
built-in tokenizer (written into the demo folder, so the job renders the prompts' ids itself), the
same sample, GPU time in place of dollars and the server's own token ids in the rows.
`regen demo --fleets` rehearses both fleets in one job: both simulators, the GPUs first and
OpenRouter paced to a deadline the GPUs alone would miss (docs/fleets.md), so the plan said before
the start has OpenRouter carry part of the work within the budget.
"""

from __future__ import annotations

import math
import shutil
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from regen.cli.edge import UsageError, say
from regen.engine.config.settings import Settings

MARKER = ".regen-demo"


def demo_sim_config(speed: float = 1.0) -> object:
    from regen.sim.openrouter.config import SimConfig

    return SimConfig(
        min_completion_tokens=40,
        max_completion_tokens=600,
        chunk_interval_s=0.05,
        keepalive_interval_s=1.0,
        faults={"http_429": 0.02, "http_502": 0.01, "mid_stream_error": 0.005, "cut_mid_stream": 0.005},
        seed=7,
        time_scale=1.0 / speed,
    )


def prepare_folder(folder: Path) -> Path:
    """Lay out a fresh copy of the bundled datasets; refuse to replace a folder that is not ours."""
    if folder.exists():
        if not (folder / MARKER).exists():
            raise SystemExit(f"regen: {folder} exists and is not a regen demo folder; pass --dir elsewhere")
        shutil.rmtree(folder)
    datasets = folder / "datasets"
    datasets.mkdir(parents=True)
    (folder / MARKER).write_text("scratch folder of `regen demo`; replaced on each run\n")
    bundled = resources.files("regen.demo") / "datasets"
    for entry in bundled.iterdir():
        source = entry / "prompts.jsonl"
        if source.is_file():
            target = datasets / entry.name
            target.mkdir()
            (target / "prompts.jsonl").write_bytes(source.read_bytes())
    return datasets


def _openrouter_section(base_url: str, api_key: str) -> dict[str, Any]:
    return {
        "base_url": base_url,
        "api_key": api_key,
        "max_tokens": 512,
        # Price-weighted balancing rather than strict price order, so several providers serve.
        "provider": {"sort": None},
    }


def _job_section(folder: Path) -> dict[str, Any]:
    return {
        "dataset_roots": [folder / "datasets"],
        "run_dir": folder / "run",
        "concurrency": 64,
        "backoff_base_s": 0.5,
    }


def demo_settings(folder: Path, base_url: str, api_key: str) -> Settings:
    # Plain dicts, so REGEN_ environment variables merge into them key by key.
    return Settings(
        openrouter=_openrouter_section(base_url, api_key),
        job={**_job_section(folder), "budget_usd": 5.0},
        headless={"status_interval_s": 2.0},
    )


def demo_sglang_config(speed: float = 1.0) -> object:
    from regen.sim.sglang.config import SimSGLangConfig

    return SimSGLangConfig(
        served_model_name="kimi-k2.5",
        model_path="demo/Kimi-K2.5",
        tp_size=8,
        startup_weights_s=0.0,
        startup_kv_pool_s=0.0,
        startup_cuda_graph_s=0.0,
        startup_http_s=0.0,
        startup_warmup_s=0.0,
        decode_tokens_per_s=120.0,
        output_len_min=40,
        output_len_max=400,
        child_processes=0,
        faults={"abort_rate": 0.01},
        seed=7,
        time_scale=1.0 / speed,
    )


def _sglang_sections(folder: Path, base_url: str) -> dict[str, Any]:
    """The SGLang simulator's server and the built-in tokenizer the job renders the prompts' ids with."""
    return {
        "sglang": {"urls": [base_url], "served_model_name": "kimi-k2.5", "metrics_interval_s": 1.0},
        "tokenizer": {"path": folder / "tokenizer", "workers": 1},
    }


def demo_sglang_settings(folder: Path, base_url: str) -> Settings:
    return Settings(
        openrouter={"max_tokens": 512},
        **_sglang_sections(folder, base_url),
        job={**_job_section(folder), "backend": "sglang"},
        headless={"status_interval_s": 2.0},
    )


# Both fleets (`--fleets`): the GPUs run this many requests at once, at about this many output
# tokens/s together (what the plan before the start assumes, until it has measured them), and the
# deadline is about two thirds of what they alone would need for the sample: OpenRouter must carry
# the rest. At --speed N everything runs N times faster, the deadline N times nearer.
FLEET_GPU_RUNNING = 4
FLEET_GPU_TOKENS_PER_S = 420.0
FLEET_DEADLINE_S = 140
FLEET_BUDGET_USD = 0.5


def demo_fleets_settings(
    folder: Path, gpu_url: str, paid_url: str, api_key: str, speed: float = 1.0
) -> Settings:
    """Both fleets: the SGLang simulator first, OpenRouter's simulator for what the GPUs cannot make
    by the deadline, its share paced (docs/fleets.md, "Pacing")."""
    return Settings(
        openrouter=_openrouter_section(paid_url, api_key),
        **_sglang_sections(folder, gpu_url),
        job={
            **_job_section(folder),
            "backends": ["sglang", "openrouter"],
            # The GPUs' lane holds a request more per running one, not a queue the GPUs would finish
            # after the deadline while OpenRouter waits for work.
            "backend_concurrency": {"sglang": 2 * FLEET_GPU_RUNNING, "openrouter": 16},
            "budget_usd": FLEET_BUDGET_USD,
            "deadline": f"{max(1, math.ceil(FLEET_DEADLINE_S / speed))}s",
        },
        steering={
            "gpu_tokens_per_s": FLEET_GPU_TOKENS_PER_S * speed,
            "request_tokens_per_s": 30.0 * speed,
            "interval_s": 1.0,
            "smoothing_s": 10.0,
        },
        # The sample's answers are a few hundred tokens, not the setting's 2,000 of a reasoning model.
        stats={"expected_output_tokens": 250},
        headless={"status_interval_s": 2.0},
    )


def run_demo(
    folder: Path, *, headless: bool, speed: float = 1.0, prepared: bool = False, backend: str = "openrouter"
) -> int:
    """The demo: in the console when there is a terminal (the job runs detached, as with
    `regen run`), else headless in this process."""
    if speed <= 0:
        raise UsageError("--speed must be positive")
    if not prepared:
        prepare_folder(folder)
        if backend in ("sglang", "fleets"):
            from regen.sim.sglang.tokens import builtin_tokenizer_folder

            builtin_tokenizer_folder(folder / "tokenizer")
    if not headless and sys.stdout.isatty():
        return _demo_in_console(folder, speed, backend)
    if backend == "sglang":
        return _demo_sglang_headless(folder, speed)
    if backend == "fleets":
        return _demo_fleets_headless(folder, speed)
    return _demo_headless(folder, speed)


async def _run_job(settings: Settings) -> int:
    """The demo's job, headless, on a simulator already up; its exit code."""
    from regen.engine.control.headless import run_headless
    from regen.engine.job.job import Job

    # prepares it, a signal meanwhile heard; a JobError reaches the edge (cli/edge.py)
    return (await run_headless(Job(settings))).exit_code


def _demo_sglang_headless(folder: Path, speed: float) -> int:
    from regen.engine.runtime import run
    from regen.sim.sglang.logs import SimLog
    from regen.sim.sglang.server import SGLangSim
    from regen.sim.sglang.tokens import SimTokenizer

    async def go() -> int:
        config = demo_sglang_config(speed)
        log = open(folder / "sglang-sim.log", "w", encoding="utf-8")  # noqa: SIM115 - closed below
        sim = SGLangSim(config, SimTokenizer(folder / "tokenizer"), log=SimLog(log))  # type: ignore[arg-type]
        await sim.start()
        try:
            await sim.wait_ready(30)
            print(
                f"regen demo: SGLang simulator at {sim.base_url}, results under {folder}/datasets", flush=True
            )
            return await _run_job(demo_sglang_settings(folder, sim.base_url))
        finally:
            await sim.stop()
            log.close()

    return run(go())


def _demo_fleets_headless(folder: Path, speed: float) -> int:
    from regen.engine.runtime import run
    from regen.sim.openrouter.server import OpenRouterSim
    from regen.sim.sglang.logs import SimLog
    from regen.sim.sglang.server import SGLangSim
    from regen.sim.sglang.tokens import SimTokenizer

    async def go() -> int:
        gpu_config = demo_sglang_config(speed).model_copy(  # type: ignore[attr-defined]
            update={"max_running_requests": FLEET_GPU_RUNNING}
        )
        paid_config = demo_sim_config(speed)
        log = open(folder / "sglang-sim.log", "w", encoding="utf-8")  # noqa: SIM115 - closed below
        gpus = SGLangSim(gpu_config, SimTokenizer(folder / "tokenizer"), log=SimLog(log))
        paid = OpenRouterSim(paid_config)  # type: ignore[arg-type]
        await gpus.start()
        try:
            await paid.start()
            try:
                await gpus.wait_ready(30)
                print(
                    f"regen demo: SGLang simulator at {gpus.base_url}, OpenRouter simulator at {paid.base_url}, "
                    f"results under {folder}/datasets",
                    flush=True,
                )
                key = paid_config.api_keys[0]  # type: ignore[attr-defined]
                return await _run_job(demo_fleets_settings(folder, gpus.base_url, paid.base_url, key, speed))
            finally:
                await paid.stop()
        finally:
            await gpus.stop()
            log.close()

    return run(go())


def _demo_in_console(folder: Path, speed: float, backend: str = "openrouter") -> int:
    from regen.cli.attach import start_detached
    from regen.console.client import SocketSource
    from regen.console.launch import run_console
    from regen.console.options import ConsoleOptions
    from regen.engine.control.server import SOCKET_NAME

    run_dir = folder / "run"
    job_args = ["demo", "--headless", "--prepared", "--dir", str(folder.resolve()), "--speed", str(speed)]
    job_args += ["--fleets"] if backend == "fleets" else ["--backend", backend]
    code, said = start_detached(run_dir, job_args)
    if code != 0:
        say(said or f"the demo job ended at once (exit {code})")
        return code
    return run_console(SocketSource(run_dir / SOCKET_NAME), options=ConsoleOptions(export_dir=run_dir))


def _demo_headless(folder: Path, speed: float) -> int:
    from regen.engine.runtime import run
    from regen.sim.openrouter.server import OpenRouterSim

    async def go() -> int:
        config = demo_sim_config(speed)
        sim = OpenRouterSim(config)  # type: ignore[arg-type]
        await sim.start()
        try:
            settings = demo_settings(folder, sim.base_url, config.api_keys[0])  # type: ignore[attr-defined]
            print(f"regen demo: simulator at {sim.base_url}, results under {folder}/datasets", flush=True)
            return await _run_job(settings)
        finally:
            await sim.stop()

    return run(go())
