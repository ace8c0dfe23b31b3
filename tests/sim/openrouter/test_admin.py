"""Admin routes, config files and the standalone entry point."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest
from pydantic import ValidationError

from regen.sim.configs import patched
from regen.sim.openrouter.config import SimConfig, SimConfigError, load_sim_config
from regen.sim.openrouter.server import OpenRouterSim
from tests.support.openrouter_http import KEY, Api
from tests.support.processes import ROOT


async def test_state_route(api: Api, osim: OpenRouterSim) -> None:
    await api.chat(provider={"only": ["parasail"]})
    await api.chat(key=None)
    state = (await api.get("/_sim/state", key=None)).json
    assert state["counters"]["total_requests"] == 2
    assert state["counters"]["in_flight"] == 0 and state["counters"]["peak_in_flight"] >= 1
    assert state["served"] == {"parasail/fp8": 1}
    assert state["ledger"]["records"] == 1
    assert state["ledger"]["billed_total"] == str(osim.billing.billed_total)
    assert state["ledger"]["balance"] == osim.billing.balance


async def test_config_patch_merges(api: Api, osim: OpenRouterSim) -> None:
    url = api.root("/_sim/config")
    osim.config.faults = {"http_429": 0.0}
    async with api.session.post(url, json={"faults": {"http_502": 1.0}}) as r:
        assert r.status == 200
    assert osim.config.faults == {"http_429": 0.0, "http_502": 1.0}
    assert (await api.chat()).status == 502
    async with api.session.post(url, json={"faults": {"http_502": None}, "credits": 5}) as r:
        assert r.status == 200 and (await r.json())["config"]["credits"] == 5
    assert osim.config.faults == {"http_429": 0.0} and osim.billing.credits == 5
    assert (await api.chat()).status == 200
    for bad in ({"faults": {"http_999": 1}}, {"faults": {"http_502": 2}}, {"nonsense": 1}):
        async with api.session.post(url, json=bad) as r:
            assert r.status == 400
    async with api.session.post(url, data=b"{") as r:
        assert r.status == 400
    async with api.session.get(url) as r:
        assert (await r.json())["credits"] == 5


def test_patched_validates() -> None:
    base = SimConfig()
    new = patched(base, {"endpoint_overrides": {"fireworks": {"tokens_per_s": 500}}})
    assert new.endpoint_overrides == {"fireworks": {"tokens_per_s": 500}}
    assert base.endpoint_overrides == {}
    with pytest.raises(ValidationError):
        patched(base, {"usage_shape": "D"})


def test_load_sim_config_files(tmp_path: Path) -> None:
    assert load_sim_config(None) == SimConfig()
    toml = tmp_path / "sim.toml"
    toml.write_text('credits = 12.5\nusage_shape = "B"\n[faults]\nhttp_502 = 0.1\n')
    cfg = load_sim_config(toml)
    assert cfg.credits == 12.5 and cfg.usage_shape == "B" and cfg.faults == {"http_502": 0.1}
    wrapped = tmp_path / "wrapped.toml"
    wrapped.write_text("[openrouter]\nseed = 9\n")
    assert load_sim_config(wrapped).seed == 9
    js = tmp_path / "sim.json"
    js.write_text('{"api_keys": ["sk-sim-a"], "provider_faults": {"parasail": {"http_502": 1}}}')
    assert load_sim_config(js).api_keys == ["sk-sim-a"]


@pytest.mark.parametrize(
    ("name", "text", "fragment"),
    [
        ("bad.toml", "credits = [", "not valid TOML"),
        ("bad.json", "{", "not valid JSON"),
        ("typo.toml", "credit = 3\n", "credit"),
        ("fault.json", '{"faults": {"http_418": 0.5}}', "http_418"),
        ("conf.yaml", "a: 1", "unsupported"),
        ("list.json", "[1]", "top level"),
    ],
)
def test_load_sim_config_errors_name_file_and_problem(
    tmp_path: Path, name: str, text: str, fragment: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SimConfigError) as info:
        load_sim_config(path)
    assert str(path) in str(info.value) and fragment in str(info.value)
    assert isinstance(info.value, ValueError)
    with pytest.raises(SimConfigError, match="cannot read"):
        load_sim_config(tmp_path / "missing.toml")


async def test_module_entry_point_serves_until_sigterm(tmp_path: Path) -> None:
    cfg = tmp_path / "sim.json"
    cfg.write_text('{"time_scale": 0.001}')
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "regen.sim",
        "openrouter",
        "--port",
        "0",
        "--config",
        str(cfg),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().strip()
        prefix = "regen sim openrouter listening on "
        assert line.startswith(prefix) and line.endswith("/api/v1")
        base = line[len(prefix) :]
        async with aiohttp.ClientSession() as s:
            body = orjson.dumps({"messages": [{"role": "user", "content": "hi"}]})
            async with s.post(
                base + "/chat/completions", data=body, headers={"Authorization": f"Bearer {KEY}"}
            ) as r:
                assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_module_entry_point_bad_config_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("credits = 'lots'\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "regen.sim",
        "--config",
        str(cfg),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 2
    assert str(cfg) in err.decode() and "Traceback" not in err.decode()


def test_engine_sim_never_imports_textual() -> None:
    import subprocess

    code = (
        "import sys, regen.sim, regen.sim.runner, regen.sim.openrouter.server; "
        "assert not any(m.startswith('textual') for m in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
