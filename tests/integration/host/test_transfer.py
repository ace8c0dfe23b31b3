"""`regen pull` and `regen push` over a real sshd: verified, resumable, never clobbering."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from regen.engine.config.loading import load_settings
from regen.engine.data.datasets import discover
from regen.engine.data.tokenizer import TargetTokenizer, TokenizerSpec
from regen.engine.host.ssh import HostConnection
from regen.engine.host.transfer import fetch_tokenizer, pull, push
from tests.support.hosts import HostFactory, write_settings
from tests.support.processes import ENV, run_regen
from tests.support.sshd import SshServer
from tests.support.tiktoken_model import build_tiktoken_tokenizer

TOKENIZER_FILES = {
    "tokenizer_config.json",
    "tiktoken.model",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
    "config.json",
    "tokenization_fake.py",
    "configuration_fake.py",
}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_pull_brings_datasets_and_tokenizer_verified_and_a_run_uses_them(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    settings = write_settings(tmp_path / "settings.toml", [make_host(sshd, tree)], ws)
    done = run_regen("pull", "--settings", str(settings))
    assert done.returncode == 0, done.stderr
    for name in ("B1", "$(touch x)", "a b;c"):
        local = ws / "datasets" / name / "prompts.jsonl"
        assert sha(local) == sha(tree["data"] / name / "prompts.jsonl"), f"{name} pulled whole, name kept"
        assert f"{name}/prompts.jsonl: pulled" in done.stdout
    assert not (ws / "datasets" / ".hidden").exists() and not (ws / "datasets" / "not-a-dataset").exists()
    assert {p.name for p in (ws / "tokenizer").iterdir()} == TOKENIZER_FILES
    for p in (ws / "tokenizer").iterdir():
        assert sha(p) == sha(tree["model"] / p.name)
    assert not list(ws.rglob("*.part")) and not (tmp_path / "x").exists() and not (Path.home() / "x").exists()
    assert "'a b;c' is not usable" in done.stderr, "the odd names are flagged"

    again = run_regen("pull", "--settings", str(settings), "--json")
    assert again.returncode == 0
    report = json.loads(again.stdout)
    assert report["ok"] and {f["action"] for f in report["files"]} == {"up to date"}

    # A run then finds the workspace without further settings.
    loaded = load_settings(settings)
    assert loaded.job.dataset_roots == [ws / "datasets"] and loaded.tokenizer.path == ws / "tokenizer"


def test_a_run_uses_pulled_datasets(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    settings = write_settings(tmp_path / "settings.toml", [make_host(sshd, tree)], ws)
    assert run_regen("pull", "--settings", str(settings), "B1").returncode == 0
    loaded = load_settings(settings)
    assert [d.name for d in discover(loaded.job.datasets, loaded.job.dataset_roots)] == ["B1"]
    # The pulled tokenizer is the one a run loads (and, holding its own code, it asks for trust first).
    verify = run_regen("verify", "--settings", str(settings))
    assert (
        f"{ws / 'tokenizer'}: this tokenizer runs tokenization_fake.py (auto_map in tokenizer_config.json); "
        "set tokenizer.trust_remote_code = true"
    ) in verify.stderr
    explicit = tmp_path / "explicit.toml"
    explicit.write_text(
        settings.read_text().replace(
            f'workspace = "{ws}"', f'workspace = "{ws}"\n[job]\ndatasets = ["elsewhere"]'
        )
    )
    assert load_settings(explicit).job.dataset_roots == [], "settings given explicitly win"


def test_pull_never_replaces_a_local_file_that_differs(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    settings = write_settings(tmp_path / "settings.toml", [make_host(sshd, tree)], ws)
    local = ws / "datasets" / "B1" / "prompts.jsonl"
    local.parent.mkdir(parents=True)
    local.write_bytes(b'{"messages": [{"role": "user", "content": "mine"}]}\n')
    before = local.read_bytes()
    done = run_regen("pull", "--settings", str(settings), "B1")
    assert done.returncode == 1 and "exists and differs from the host's file" in done.stderr
    assert local.read_bytes() == before


def test_pull_of_an_unknown_dataset_names_what_there_is(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    settings = write_settings(tmp_path / "settings.toml", [make_host(sshd, tree)], tmp_path / "ws")
    done = run_regen("pull", "--settings", str(settings), "B9")
    assert done.returncode == 1
    assert "no dataset 'B9'" in done.stderr and "found: $(touch x), B1, a b;c" in done.stderr


def test_an_interrupted_pull_resumes_where_it_stopped(
    sshd: SshServer, own_tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    big = own_tree["data"] / "big"
    big.mkdir()
    block = b"".join(
        orjson.dumps({"messages": [{"role": "user", "content": f"prompt {i} " + "y" * (i % 300)}]}) + b"\n"
        for i in range(2000)
    )
    with open(big / "prompts.jsonl", "wb") as f:
        for _ in range(120):  # ~40 MB
            f.write(block)
    total = (big / "prompts.jsonl").stat().st_size
    ws = tmp_path / "ws"
    settings = write_settings(tmp_path / "settings.toml", [make_host(sshd, own_tree)], ws)
    dest = ws / "datasets" / "big"
    proc = subprocess.Popen(
        [sys.executable, "-m", "regen.cli.main", "pull", "--settings", str(settings), "big"],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    part = None
    while time.monotonic() < deadline and proc.poll() is None:
        parts = list(dest.glob(".prompts.jsonl.*.part")) if dest.exists() else []
        if parts and parts[0].stat().st_size > 0:
            part = parts[0]
            break
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)  # no chance to clean up: a real interruption
    proc.communicate()
    assert part is not None, "the pull ended before it could be interrupted"
    got = part.stat().st_size
    assert 0 < got < total and not (dest / "prompts.jsonl").exists(), "nothing whole is in place yet"

    done = run_regen("pull", "--settings", str(settings), "big", "--json")
    assert done.returncode == 0, done.stderr
    files = {f["file"]: f for f in json.loads(done.stdout)["files"]}
    resumed = files["big/prompts.jsonl"]
    assert resumed["action"] == "resumed" and resumed["bytes"] == total - got
    assert sha(dest / "prompts.jsonl") == sha(big / "prompts.jsonl")
    assert not list(dest.glob("*.part"))


async def test_a_part_of_a_file_that_changed_on_the_host_is_thrown_away(
    sshd: SshServer, own_tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    dest = ws / "datasets" / "B1"
    dest.mkdir(parents=True)
    # A part from an earlier version of the host file, with bytes that are not the current file's.
    stale = dest / ".prompts.jsonl.0123456789abcdef.part"
    stale.write_bytes(b"garbage from an older file\n")
    conn = HostConnection(make_host(sshd, own_tree))
    try:
        report = await pull(conn, ws, ["B1"])
    finally:
        await conn.close()
    assert report.ok and report.outcomes[0].action == "pulled"
    assert sha(dest / "prompts.jsonl") == sha(own_tree["b1"] / "prompts.jsonl") and not stale.exists()


def rows(*lines: int) -> bytes:
    return b"".join(orjson.dumps({"id": f"B1-{i:08d}", "line": i, "status": "ok"}) + b"\n" for i in lines)


async def pulled_workspace(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory, ws: Path
) -> HostConnection:
    conn = HostConnection(make_host(sshd, tree))
    report = await pull(conn, ws)
    assert report.ok
    return conn


async def test_push_appends_the_missing_tail_and_creates_what_is_missing(
    sshd: SshServer, own_tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    conn = await pulled_workspace(sshd, own_tree, make_host, ws)
    try:
        remote_b1 = own_tree["b1"] / "raw_responses.jsonl"
        host_rows = remote_b1.read_bytes()
        local_b1 = ws / "datasets" / "B1" / "raw_responses.jsonl"
        # The local file is the host's plus more rows, and a torn last row that must not travel.
        local_b1.write_bytes(host_rows + rows(10, 11, 12) + b'{"id": "B1-00000013", "li')
        odd_local = ws / "datasets" / "$(touch x)" / "raw_responses.jsonl"
        odd_local.write_bytes(rows(0, 1))
        report = await push(conn, ws)
    finally:
        await conn.close()
    actions = {o.what: o.action for o in report.outcomes}
    assert actions == {"B1/raw_responses.jsonl": "appended", "$(touch x)/raw_responses.jsonl": "created"}, (
        report
    )
    assert remote_b1.read_bytes() == host_rows + rows(10, 11, 12), "the tail appended, the torn row held back"
    assert (own_tree["data"] / "$(touch x)" / "raw_responses.jsonl").read_bytes() == rows(0, 1)
    assert not list(own_tree["data"].rglob("*.regen-push.tmp"))
    assert not (Path.home() / "x").exists()


async def test_push_refuses_to_clobber_and_says_why(
    sshd: SshServer, own_tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    conn = await pulled_workspace(sshd, own_tree, make_host, ws)
    remote = own_tree["b1"] / "raw_responses.jsonl"
    host_rows = remote.read_bytes()
    local = ws / "datasets" / "B1" / "raw_responses.jsonl"
    prompts = ws / "datasets" / "B1" / "prompts.jsonl"

    async def refused(why: str) -> None:
        report = await push(conn, ws, ["B1"])
        assert not report.ok and report.outcomes[0].action == "refused"
        assert why in report.outcomes[0].detail, report.outcomes[0].detail
        assert remote.read_bytes() == host_rows, "the host's file is untouched"

    try:
        # A different history: the first row differs, the rest would fit.
        local.write_bytes(rows(99) + host_rows[host_rows.index(b"\n") + 1 :] + rows(10))
        await refused("is not a prefix of the local one")
        # The host has more than the local file: never truncated.
        local.write_bytes(host_rows[: host_rows.index(b"\n") + 1])
        await refused("never truncated")
        # Results for prompts that are not the host's.
        prompts.write_bytes(prompts.read_bytes() + b'{"messages": [{"role": "user", "content": "extra"}]}\n')
        local.write_bytes(host_rows + rows(10))
        await refused("belong to other prompts")
        # Equal files: nothing to do.
        prompts.write_bytes((own_tree["b1"] / "prompts.jsonl").read_bytes())
        local.write_bytes(host_rows)
        report = await push(conn, ws, ["B1"])
        assert report.ok and report.outcomes[0].action == "up to date"
    finally:
        await conn.close()


def test_the_push_command_exits_1_on_a_refusal_and_0_when_in_step(
    sshd: SshServer, own_tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    settings = write_settings(tmp_path / "settings.toml", [make_host(sshd, own_tree)], ws)
    assert run_regen("pull", "--settings", str(settings), "B1").returncode == 0
    remote = own_tree["b1"] / "raw_responses.jsonl"
    host_rows = remote.read_bytes()
    local = ws / "datasets" / "B1" / "raw_responses.jsonl"
    local.write_bytes(rows(99) + host_rows)
    done = run_regen("push", "--settings", str(settings))
    assert done.returncode == 1 and "B1/raw_responses.jsonl" in done.stderr and "not a prefix" in done.stderr
    assert "Traceback" not in done.stderr and remote.read_bytes() == host_rows
    local.write_bytes(host_rows + rows(10))
    done = run_regen("push", "--settings", str(settings), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["files"] == [
        {
            "file": "B1/raw_responses.jsonl",
            "action": "appended",
            "detail": f"{len(rows(10)):,} bytes after the host's {len(host_rows):,}",
            "bytes": len(rows(10)),
            "ok": True,
        }
    ]


def test_push_to_a_dataset_the_host_lacks_is_refused(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    (ws / "datasets" / "local-only").mkdir(parents=True)
    (ws / "datasets" / "local-only" / "raw_responses.jsonl").write_bytes(rows(0))
    settings = write_settings(tmp_path / "settings.toml", [make_host(sshd, tree)], ws)
    done = run_regen("push", "--settings", str(settings))
    assert done.returncode == 1 and "the host has no dataset 'local-only'" in done.stderr


def test_odd_names_given_on_the_command_line_are_only_names(
    sshd: SshServer, tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    settings = write_settings(tmp_path / "settings.toml", [make_host(sshd, tree)], ws)
    done = run_regen("pull", "--settings", str(settings), "$(touch x)", "a b;c", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for name in ("$(touch x)", "a b;c"):
        assert sha(ws / "datasets" / name / "prompts.jsonl") == sha(tree["data"] / name / "prompts.jsonl")
    assert not (ws / "datasets" / "B1").exists()
    for folder in (Path.home(), tmp_path, tree["data"], tree["data"].parent):
        assert not (folder / "x").exists(), folder


async def test_kimis_own_tokenizer_shape_is_pulled_and_fetched_whole_and_loads_as_on_the_host(
    sshd: SshServer, own_tree: dict[str, Path], make_host: HostFactory, tmp_path: Path
) -> None:
    """Kimi's folder holds tiktoken.model, the remote code auto_map names and chat_template.jinja, no
    tokenizer.json (docs/data-contract.md §8.1, §9): `regen pull` and the run's own fetch bring all of
    it, and the copy gives the host folder's ids."""
    model = build_tiktoken_tokenizer(own_tree["model"].parent / "Kimi-K2.5")
    host = make_host(sshd, own_tree, model_path=str(model))
    ws = tmp_path / "ws"
    done = run_regen("pull", "--settings", str(write_settings(tmp_path / "settings.toml", [host], ws)))
    assert done.returncode == 0, done.stderr
    shipped = {"tiktoken.model", "tokenization_kimi.py", "tokenizer_config.json", "chat_template.jinja"}
    assert {p.name for p in (ws / "tokenizer").iterdir()} == shipped
    fetched = tmp_path / "fetched"
    report = await fetch_tokenizer([host], fetched)
    assert report.ok and {p.name for p in (fetched / "tokenizer").iterdir()} == shipped
    on_host = TargetTokenizer(
        TokenizerSpec(model, trust_remote_code=True, template_kwargs={"thinking": True})
    )
    messages = [{"role": "user", "content": "What is 1+1? 東京 <|im_end|>"}]
    for folder in (ws / "tokenizer", fetched / "tokenizer"):
        local = TargetTokenizer(
            TokenizerSpec(folder, trust_remote_code=True, template_kwargs={"thinking": True})
        )
        assert local.files_sha256 == on_host.files_sha256
        assert local.prompt_ids(messages) == on_host.prompt_ids(messages)
        assert local.retokenize("why", "because", "stop") == on_host.retokenize("why", "because", "stop")
