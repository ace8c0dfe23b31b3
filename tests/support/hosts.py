"""A GPU host's side for the host tests (and bench/inspect_host.py): its files (datasets with bad
lines and odd names, a model folder without weights) and the [[hosts]] settings that point regen at
a host served by tests/support/sshd.py."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from regen.engine.config.settings import HostSettings
from tests.support.sshd import SshServer

# The tests' host runs the interpreter running the tests (it has orjson, as a GPU host with SGLang does).
HOST_PYTHON = sys.executable


def line(messages: list[dict[str, Any]], **extra: Any) -> bytes:
    return orjson.dumps({"messages": messages, **extra})


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


# B1: 40 lines; line numbers (1-based) of the bad ones and why, and two duplicates of line 1.
B1_BAD = {
    5: b"",
    9: b"{not json",
    14: line([user("q"), {"role": "assistant", "content": "a"}]),
    22: line([{"role": "bot", "content": "x"}, user("q")]),
    30: b'{"messages": "hello"}',
}
B1_DUPLICATE_OF_1 = (17, 33)


def b1_lines() -> list[bytes]:
    out = []
    for n in range(1, 41):
        if n in B1_BAD:
            out.append(B1_BAD[n])
        elif n in B1_DUPLICATE_OF_1 or n == 1:
            out.append(line([user("the same question")]))
        elif n % 4 == 0:
            out.append(
                line(
                    [
                        {"role": "system", "content": "be brief"},
                        user(f"q{n}"),
                        {"role": "assistant", "content": "a"},
                        user("more"),
                    ],
                    id=f"src-{n}",
                    source="web",
                )
            )
        else:
            out.append(line([user(f"question number {n} " + "x" * n)]))
    return out


def build_tree(root: Path) -> dict[str, Path]:
    """The host's files: data_root with datasets (odd names among them) and a model folder."""
    data = root / "data"
    data.mkdir(parents=True)
    b1 = data / "B1"
    b1.mkdir()
    (b1 / "prompts.jsonl").write_bytes(b"\n".join(b1_lines()) + b"\n")
    # Rows for 0-based lines 0..9 minus the blank line 4, one row twice, one for no prompt line.
    rows = [
        orjson.dumps({"id": f"B1-{i:08d}", "line": i, "status": "ok"})
        for i in (0, 1, 2, 3, 5, 6, 7, 8, 9, 9, 500)
    ]
    (b1 / "raw_responses.jsonl").write_bytes(b"\n".join(rows) + b"\n")
    for name, count in (("$(touch x)", 6), ("a b;c", 4)):
        folder = data / name
        folder.mkdir()
        body = [line([user(f"{name} prompt {i}")]) for i in range(count)]
        body.append(b'{"messages": [{"role": "user", "content": ["multimodal"]}]}')
        (folder / "prompts.jsonl").write_bytes(b"\n".join(body) + b"\n")
    (data / ".hidden").mkdir()
    (data / ".hidden" / "prompts.jsonl").write_bytes(line([user("hidden")]) + b"\n")
    (data / "not-a-dataset").mkdir()
    (data / "not-a-dataset" / "notes.txt").write_text("no prompts here\n")

    model = root / "models" / "Fake-K2"
    model.mkdir(parents=True)
    (model / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["FakeK2ForCausalLM"],
                "model_type": "fake_k2",
                "auto_map": {
                    "AutoConfig": "configuration_fake.FakeConfig",
                    "AutoModel": "modeling_fake.FakeModel",
                },
                "quantization_config": {
                    "quant_method": "compressed-tensors",
                    "format": "int4",
                    "ignore": ["lm_head"],
                },
            }
        )
    )
    (model / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "auto_map": {"AutoTokenizer": ["tokenization_fake.FakeTokenizer", None]},
                "tokenizer_class": "FakeTokenizer",
            }
        )
    )
    (model / "tiktoken.model").write_bytes(os.urandom(3000))
    (model / "tokenization_fake.py").write_text("class FakeTokenizer:\n    pass\n")
    (model / "configuration_fake.py").write_text("class FakeConfig:\n    pass\n")
    (model / "modeling_fake.py").write_text("raise ImportError('weights code is not pulled')\n")
    (model / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    (model / "generation_config.json").write_text('{"max_length": 262144}')
    (model / "special_tokens_map.json").write_text('{"eos_token": "<|im_end|>"}')
    for i in (1, 2):
        (model / f"model-0000{i}-of-00002.safetensors").write_bytes(b"\0" * 1024)
    return {"data": data, "model": model, "b1": b1}


HostFactory = Callable[..., HostSettings]


def host_settings(
    server: SshServer, tree: dict[str, Path], known_dir: Path, **overrides: Any
) -> HostSettings:
    """A [[hosts]] entry for `server` serving `tree`; its known_hosts file is written in `known_dir`
    unless `known_hosts` is given."""
    known = overrides.pop("known_hosts", None)
    if known is None:
        known = server.write_known_hosts(known_dir / f"known_hosts-{server.port}")
    fields: dict[str, Any] = {
        "name": "gpu1",
        "address": "127.0.0.1",
        "port": server.port,
        "user": server.user,
        "key_files": [server.client_key],
        "known_hosts": known,
        "data_root": str(tree["data"]),
        "model_path": str(tree["model"]),
        "python": HOST_PYTHON,
        "connect_timeout_s": 5.0,
    }
    fields.update(overrides)
    return HostSettings(**fields)


def write_settings(path: Path, hosts: list[HostSettings], workspace: Path, extra: str = "") -> Path:
    """A settings.toml with these [[hosts]] tables, as an operator would write it."""
    out = [f'workspace = "{workspace}"', extra]
    for h in hosts:
        out.append("[[hosts]]")
        for key, value in h.model_dump(mode="json").items():
            if value is None:
                continue
            out.append(f"{key} = {json.dumps(value)}")
    path.write_text("\n".join(out) + "\n")
    return path
