"""`regen inspect` against a real sshd: every line checked on the host, odd names only names, exit codes."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from regen.engine.data.datasets import Dataset
from regen.engine.data.scan import scan
from regen.engine.host.inspect import format_report, inspect_host
from regen.engine.host.ssh import HostConnection
from tests.support.hosts import B1_BAD, HostFactory, write_settings
from tests.support.processes import free_port, run_regen
from tests.support.sshd import SshServer


def no_x_anywhere(*folders: Path) -> None:
    for folder in folders:
        assert not (folder / "x").exists(), f"a file x appeared in {folder}: a name ran as a command"


async def test_every_line_is_checked_on_the_host_by_the_jobs_rules(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory
) -> None:
    conn = HostConnection(make_host(sshd, tree))
    try:
        record = await inspect_host(conn)
    finally:
        await conn.close()
    assert record["ok"] and [d["name"] for d in record["datasets"]] == ["$(touch x)", "B1", "a b;c"]
    b1 = next(d for d in record["datasets"] if d["name"] == "B1")
    prompts = tree["b1"] / "prompts.jsonl"
    assert b1["lines"] == 40 and b1["valid"] == 35 and b1["invalid_count"] == 5
    assert [i["line"] for i in b1["invalid"]] == sorted(B1_BAD), "1-based line numbers"
    reasons = {i["line"]: i["reason"] for i in b1["invalid"]}
    assert reasons[5] == "blank line" and reasons[9] == "not valid JSON"
    assert reasons[14] == "last message is not from the user" and reasons[30] == "messages is not a list"
    assert "role 'bot' not allowed" in reasons[22]
    assert b1["duplicates"] == 2
    assert b1["bytes"] == prompts.stat().st_size
    assert b1["sha256"] == hashlib.sha256(prompts.read_bytes()).hexdigest()

    # The same rules as the job's own scan, line for line.
    local = scan(Dataset("B1", tree["b1"]))
    assert [(i.line + 1, i.reason) for i in local.invalid] == [
        (i["line"], i["reason"]) for i in b1["invalid"]
    ]
    assert b1["duplicates"] == local.duplicates
    assert b1["turns"] == {str(k): v for k, v in sorted(local.turns.items())}
    assert b1["content_chars"] == local.content_chars_percentiles() and b1["content_chars_exact"]
    assert b1["extra_keys"] == local.extra_keys == {"source": 10}

    # Rows for 0-based lines 0-3 and 5-9, line 9 twice, and one for a line that does not exist.
    assert b1["results"]["rows"] == 11 and b1["results"]["covered"] == 9
    assert b1["results"]["duplicate_rows"] == 1 and b1["results"]["stray_rows"] == 1

    for name in ("$(touch x)", "a b;c"):
        odd = next(d for d in record["datasets"] if d["name"] == name)
        assert odd["path"] == str(tree["data"] / name)
        assert odd["invalid"] == [
            {"line": odd["lines"], "reason": "message 1: content is a list of parts (multimodal)"}
        ]
        assert "not usable" in odd["name_problem"]
        assert odd["results"] is None
    no_x_anywhere(Path.home(), tree["data"], tree["data"].parent, Path.cwd())

    assert [g["index"] for g in record["gpus"]] == [0, 1] and record["gpu_error"] is None
    assert record["gpus"][0]["memory_used_mib"] == 81234 and record["gpus"][0]["utilization_pct"] == 97
    assert record["gpus"][0]["processes"] == [{"pid": 4242, "name": "python3", "memory_mib": 81000}]
    assert record["gpus"][1]["utilization_pct"] is None, "[N/A] is no number"
    assert record["disk"]["data_root"]["free_bytes"] > 0 and record["disk"]["model_path"]["exists"]
    model = record["model"]
    assert model["architectures"] == ["FakeK2ForCausalLM"] and model["model_type"] == "fake_k2"
    assert model["quantization"] == {"quant_method": "compressed-tensors", "format": "int4"}
    assert set(model["tokenizer_files"]) == {
        "tokenizer_config.json",
        "tiktoken.model",
        "special_tokens_map.json",
        "chat_template.jinja",
        "generation_config.json",
        "tokenization_fake.py",
        "configuration_fake.py",
    }
    assert model["safetensors_files"] == 2
    assert record["versions"]["python"].count(".") == 2 and record["versions"]["orjson"]

    text = "\n".join(format_report([record]))
    assert "B1" in text and "line 22: message 1: role 'bot' not allowed" in text
    assert "GPU 0 NVIDIA H200: 81,234 / 143,771 MiB, 97% busy" in text


async def test_one_connection_serves_many_commands(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory
) -> None:
    log = sshd.root / "sshd.log"
    before = log.read_text().count("Accepted publickey")
    conn = HostConnection(make_host(sshd, tree))
    try:
        for _ in range(3):
            await conn.hostcmd(["status", str(tree["data"]), ""])
        await inspect_host(conn)
    finally:
        await conn.close()
    assert log.read_text().count("Accepted publickey") == before + 1, "one login, many channels"


def test_cli_json_exit_0_and_1_with_an_unreachable_host(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    good = make_host(sshd, tree)
    down = make_host(sshd, tree, name="gpu2", port=free_port(), connect_timeout_s=2.0)
    settings = write_settings(tmp_path / "settings.toml", [good, down], tmp_path / "ws")

    done = run_regen("inspect", "--json", "--settings", str(settings), "--host", "gpu1")
    assert done.returncode == 0, done.stderr
    hosts = json.loads(done.stdout)["hosts"]
    assert [h["name"] for h in hosts] == ["gpu1"] and hosts[0]["ok"]
    b1 = next(d for d in hosts[0]["datasets"] if d["name"] == "B1")
    assert {"name", "path", "lines", "valid", "invalid", "bytes", "sha256", "results"} <= b1.keys()
    assert b1["invalid"][0] == {"line": 5, "reason": "blank line"}

    both = run_regen("inspect", "--json", "--settings", str(settings))
    assert both.returncode == 1, both.stderr
    hosts = json.loads(both.stdout)["hosts"]
    assert [h["name"] for h in hosts] == ["gpu1", "gpu2"]
    assert hosts[0]["ok"] and len(hosts[0]["datasets"]) == 3, "the reachable host is still reported"
    assert not hosts[1]["ok"] and "cannot connect" in hosts[1]["error"] and "gpu2" in hosts[1]["error"]
    assert "Traceback" not in both.stderr and "gpu2" in both.stderr

    text = run_regen("inspect", "--settings", str(settings))
    assert text.returncode == 1
    assert "gpu1 (127.0.0.1" in text.stdout and "3 datasets" in text.stdout
    assert "gpu2 (127.0.0.1" in text.stdout and "unreachable" in text.stdout
    no_x_anywhere(Path.home(), tree["data"], tmp_path)


@pytest.mark.parametrize(
    ("args", "settings_text", "expected"),
    [
        (["--host", "nope"], None, "--host nope: no such host (hosts: gpu1)"),
        ([], "", "no GPU hosts in the settings"),
        ([], "[[hosts]]\nname = 'a'\naddress = 'h'\n", "hosts.0.data_root: Field required"),
        ([], "[[hosts]]\nname = 'a b'\naddress = 'h'\ndata_root = '/d'\n", "hosts.0.name"),
        (
            [],
            "[[hosts]]\nname = 'a'\naddress = 'h'\ndata_root = '/d'\n[[hosts]]\nname = 'a'\naddress = 'g'\ndata_root = '/d'\n",
            "host name 'a' is used by more than one [[hosts]] table",
        ),
    ],
)
def test_cli_bad_usage_exits_2_with_one_line(
    args: list[str],
    settings_text: str | None,
    expected: str,
    sshd: SshServer,
    tree: dict[str, Path],
    make_host: HostFactory,
    tmp_path: Path,
) -> None:
    path = tmp_path / "settings.toml"
    if settings_text is None:
        write_settings(path, [make_host(sshd, tree)], tmp_path / "ws")
    else:
        path.write_text(settings_text)
    done = run_regen("inspect", "--settings", str(path), *args)
    assert done.returncode == 2
    assert expected in done.stderr and "Traceback" not in done.stderr
    assert all(line.startswith("regen: ") for line in done.stderr.splitlines())


def test_the_python_setting_is_an_interpreter_not_a_shell_line(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    host = make_host(sshd, tree, python=f"python3; touch {marker}")
    settings = write_settings(tmp_path / "settings.toml", [host], tmp_path / "ws")
    done = run_regen("inspect", "--settings", str(settings))
    assert done.returncode == 1 and "not found on the host" in done.stderr
    assert not marker.exists()


def test_old_python_on_the_host_is_named(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    fake = sshd.bin_dir / "python-old"
    # Called as "python-old -c BOOTSTRAP": a real Python that says it is 3.8, then runs the bootstrap.
    fake.write_text(
        "#!/bin/sh\nexec python3 -c 'import sys; sys.version_info = (3, 8, 0); exec(sys.argv[1])' \"$2\"\n"
    )
    fake.chmod(0o755)
    host = make_host(sshd, tree, python=str(fake))
    settings = write_settings(tmp_path / "settings.toml", [host], tmp_path / "ws")
    done = run_regen("inspect", "--settings", str(settings))
    assert done.returncode == 1
    assert "regen needs Python 3.10 or newer on the host" in done.stderr, done.stderr


def test_ssh_baseline_sees_the_same_file(sshd: SshServer, tree: dict[str, Path], tmp_path: Path) -> None:
    """What bench/inspect.py compares against: OpenSSH's own client on the same server."""
    known = sshd.write_known_hosts(tmp_path / "kh")
    prompts = tree["b1"] / "prompts.jsonl"
    out = subprocess.run(
        [
            "ssh",
            "-p",
            str(sshd.port),
            "-i",
            str(sshd.client_key),
            "-o",
            f"UserKnownHostsFile={known}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            f"{sshd.user}@127.0.0.1",
            f"wc -l {prompts}; sha256sum {prompts}",
        ],
        capture_output=True,
        text=True,
        check=True,
        stdin=subprocess.DEVNULL,
    ).stdout.split()
    assert out[0] == "40" and out[2] == hashlib.sha256(prompts.read_bytes()).hexdigest()


def test_the_command_line_is_fixed_and_quoted() -> None:
    from regen.engine.host.remote import BOOTSTRAP, command_line

    assert command_line("python3") == f"python3 -c '{BOOTSTRAP}'"
    assert command_line("'/opt/py env/bin/python'") == f"'/opt/py env/bin/python' -c '{BOOTSTRAP}'"
    assert command_line("~/venv/bin/python") == f"\"$HOME\"/venv/bin/python -c '{BOOTSTRAP}'"
    assert command_line("env A=1 python3 -X utf8") == f"env A=1 python3 -X utf8 -c '{BOOTSTRAP}'"
    assert command_line("python3; rm -rf ~").startswith("'python3;' rm -rf '~' -c")
    assert not set("'\\!") & set(BOOTSTRAP), "the bootstrap must read the same in every shell"


async def test_the_scripts_need_only_the_standard_library(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory
) -> None:
    """-S: no site-packages at all (no orjson, nothing of regen's): the same findings, line for line."""
    bare = "/usr/bin/python3"
    if not Path(bare).exists():  # pragma: no cover - every Debian with python3-venv has it
        pytest.skip("no system python3")
    records = []
    for python in (bare + " -I -S", sys.executable):
        conn = HostConnection(make_host(sshd, tree, python=python))
        try:
            records.append(await inspect_host(conn))
        finally:
            await conn.close()
    plain, fast = records
    assert plain["versions"]["orjson"] is None and fast["versions"]["orjson"]

    def findings(record: dict) -> list[dict]:
        return [
            {k: v for k, v in d.items() if k not in ("seconds", "cpu_seconds")} for d in record["datasets"]
        ]

    assert findings(plain) == findings(fast)
