"""What the GPU host has: GPUs, disk, the model folder, library versions, datasets, files.

Runs on the host (standard library only), shipped on stdin; every value it reads from the host's
paths is only ever a path or an argv entry, never part of a shell command (docs/gpu-host.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from typing import Any

from regen.engine.data.datasets import PROMPTS_FILE, RESULTS_FILE, name_problem

# nvidia-smi can hang on a wedged driver; a poll must not.
NVIDIA_SMI_TIMEOUT_S = 20.0
GPU_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu")
APP_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")
# What a local tokenizer needs from the model folder, beside the .py files auto_map names.
TOKENIZER_FILES = (
    "tokenizer_config.json",
    "tokenizer.json",
    "tiktoken.model",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "config.json",
)
LIBRARIES = ("sglang", "torch", "transformers", "orjson")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CHUNK = 1 << 20


def expand(path: str) -> str:
    """A host path as the login sees it: ``~`` is its home; relative paths are from the home too."""
    path = os.path.expanduser(path)
    return os.path.abspath(path if os.path.isabs(path) else os.path.join(os.path.expanduser("~"), path))


def _number(text: str) -> float | int | None:
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"
    return int(value) if value.is_integer() else value


def _smi(args: list[str]) -> list[list[str]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi not found on PATH")
    done = subprocess.run(
        [exe, *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=NVIDIA_SMI_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(f"nvidia-smi exit {done.returncode}: {said[-1] if said else 'no output'}")
    return [[cell.strip() for cell in row.split(",")] for row in done.stdout.splitlines() if row.strip()]


def gpus() -> dict[str, Any]:
    """``{"gpus": [...], "error": str | None}``: each GPU with memory (MiB), utilisation and processes."""
    try:
        rows = _smi([f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"])
        apps = _smi([f"--query-compute-apps={','.join(APP_FIELDS)}", "--format=csv,noheader,nounits"])
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return {
            "gpus": [],
            "error": str(exc)
            if not isinstance(exc, subprocess.TimeoutExpired)
            else f"nvidia-smi did not answer in {NVIDIA_SMI_TIMEOUT_S:.0f} s",
        }
    by_uuid: dict[str, list[dict[str, Any]]] = {}
    for app in apps:
        if len(app) >= len(APP_FIELDS):
            by_uuid.setdefault(app[0], []).append(
                {"pid": _number(app[1]), "name": app[2], "memory_mib": _number(app[3])}
            )
    out = []
    for row in rows:
        if len(row) < len(GPU_FIELDS):
            continue
        out.append(
            {
                "index": _number(row[0]),
                "name": row[2],
                "memory_used_mib": _number(row[3]),
                "memory_total_mib": _number(row[4]),
                "utilization_pct": _number(row[5]),
                "processes": by_uuid.get(row[1], []),
            }
        )
    return {"gpus": out, "error": None}


def disk(path: str | None) -> dict[str, Any] | None:
    if not path:
        return None
    full = expand(path)
    probe = full
    # A folder that does not exist yet is reported on the filesystem that would hold it.
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        st = os.statvfs(probe)
    except OSError as exc:
        return {"path": full, "error": exc.strerror or str(exc)}
    return {
        "path": full,
        "exists": os.path.exists(full),
        "total_bytes": st.f_blocks * st.f_frsize,
        "free_bytes": st.f_bavail * st.f_frsize,
    }


def versions() -> dict[str, Any]:
    """The host's python and, where installed, sglang, torch and transformers (read, not imported)."""
    out: dict[str, Any] = {"python": ".".join(map(str, sys.version_info[:3])), "executable": sys.executable}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _read_json(path: str) -> Any:
    with open(path, "rb") as f:
        return json.loads(f.read())


def auto_map_files(folder: str) -> list[str]:
    """The ``.py`` files ``auto_map`` names in tokenizer_config.json (and config.json's AutoConfig)."""
    names: list[str] = []
    for file, keys in (("tokenizer_config.json", None), ("config.json", ("AutoConfig",))):
        try:
            doc = _read_json(os.path.join(folder, file))
        except (OSError, ValueError):
            continue
        auto_map = doc.get("auto_map") if isinstance(doc, dict) else None
        if not isinstance(auto_map, dict):
            continue
        for key, value in auto_map.items():
            if keys is not None and key not in keys:
                continue
            for ref in value if isinstance(value, list) else [value]:
                if not isinstance(ref, str) or "." not in ref:
                    continue
                module = ref.split("--")[-1].rsplit(".", 1)[0]
                # A name from a file on the host: only a plain module name may become a file name.
                if _MODULE.match(module) and f"{module}.py" not in names:
                    names.append(f"{module}.py")
    return names


def tokenizer_files(model_path: str) -> dict[str, Any]:
    """The tokenizer files of the model folder: which are there (with sizes) and which auto_map misses."""
    folder = expand(model_path)
    if not os.path.isdir(folder):
        return {"path": folder, "exists": False, "files": [], "missing": []}
    files = []
    missing = []
    for name in (*TOKENIZER_FILES, *auto_map_files(folder)):
        full = os.path.join(folder, name)
        if os.path.isfile(full):
            files.append({"name": name, "path": full, "bytes": os.path.getsize(full)})
        elif name.endswith(".py"):
            missing.append(name)
    return {"path": folder, "exists": True, "files": files, "missing": missing}


def model_folder(model_path: str | None) -> dict[str, Any] | None:
    """Architecture and quantization from config.json, tokenizer files, weight files."""
    if not model_path:
        return None
    found = tokenizer_files(model_path)
    out: dict[str, Any] = {
        "path": found["path"],
        "exists": found["exists"],
        "tokenizer_files": [f["name"] for f in found["files"] if f["name"] != "config.json"],
        "missing_auto_map_files": found["missing"],
    }
    if not found["exists"]:
        return out
    try:
        config = _read_json(os.path.join(found["path"], "config.json"))
    except FileNotFoundError:
        out["error"] = "no config.json"
        config = {}
    except (OSError, ValueError) as exc:
        out["error"] = f"config.json: {exc}"
        config = {}
    if isinstance(config, dict):
        text = config.get("text_config")
        quant = config.get("quantization_config") or (
            text.get("quantization_config") if isinstance(text, dict) else None
        )
        out["architectures"] = config.get("architectures")
        out["model_type"] = config.get("model_type")
        # Scalars only: quantization configs can hold long module lists.
        out["quantization"] = (
            {k: v for k, v in quant.items() if isinstance(v, str | int | float | bool) or v is None}
            if isinstance(quant, dict)
            else None
        )
    weights = 0
    weight_bytes = 0
    try:
        with os.scandir(found["path"]) as entries:
            for entry in entries:
                if entry.name.endswith(".safetensors") and entry.is_file():
                    weights += 1
                    weight_bytes += entry.stat().st_size
    except OSError as exc:
        out["error"] = exc.strerror or str(exc)
    out["safetensors_files"] = weights
    out["safetensors_bytes"] = weight_bytes
    return out


def list_datasets(data_root: str) -> dict[str, Any]:
    """The subfolders of data_root holding prompts.jsonl, sorted by name (as ``discover`` finds them)."""
    root = expand(data_root)
    if not os.path.isdir(root):
        return {
            "path": root,
            "error": "does not exist" if not os.path.exists(root) else "is not a folder",
            "datasets": [],
        }
    found: list[dict[str, Any]] = []
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            prompts = os.path.join(entry.path, PROMPTS_FILE)
            if not os.path.isfile(prompts):
                continue
            results = os.path.join(entry.path, RESULTS_FILE)
            found.append(
                {
                    "name": entry.name,
                    "path": entry.path,
                    "prompts": prompts,
                    "prompts_bytes": os.path.getsize(prompts),
                    "results_bytes": os.path.getsize(results) if os.path.isfile(results) else None,
                    "name_problem": name_problem(entry.name),
                }
            )
    found.sort(key=lambda d: str(d["name"]))
    return {"path": root, "error": None, "datasets": found}


def file_digest(path: str, prefix: int | None = None) -> dict[str, Any]:
    """Size and sha256 of a file, or of its first ``prefix`` bytes; ``exists`` false when absent."""
    full = expand(path)
    try:
        f = open(full, "rb", buffering=0)  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return {"path": full, "exists": False}
    with f:
        size = os.fstat(f.fileno()).st_size
        want = size if prefix is None else min(prefix, size)
        digest = hashlib.sha256()
        left = want
        while left > 0:
            chunk = f.read(min(_CHUNK, left))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
    return {
        "path": full,
        "exists": True,
        "bytes": size,
        "hashed_bytes": want - left,
        "sha256": digest.hexdigest(),
    }
