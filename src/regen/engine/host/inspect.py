"""`regen inspect`: every line of every dataset on each GPU host, its GPUs, disk, model and libraries.

The checking runs on the host (engine/host/scripts, shipped on stdin); nothing is copied here to
inspect it. Bad lines are findings, not failures: a host that answered is ``ok`` whatever its data
holds. Record shapes are in docs/gpu-host.md ("What inspect reports").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from regen.engine.config.settings import HostSettings
from regen.engine.host.errors import HostError
from regen.engine.host.identity import ModelIdentity, mismatch
from regen.engine.host.ssh import HostConnection
from regen.engine.schema import InspectCounts

# Invalid lines the text report lists per dataset (the JSON has up to the survey's cap).
TEXT_INVALID_LINES = 10


async def inspect_host(
    conn: HostConnection, names: Sequence[str] = (), *, weight_version: str | None = "default"
) -> dict[str, Any]:
    """The inspect record of one host; raises HostError when it cannot be reached or the script fails.

    ``weight_version`` is what the servers are launched with (sglang.weight_version), part of the
    model's identity; the record's ``model_digest`` is None when the model folder cannot be read.
    """
    host = conn.host
    began = time.monotonic()
    result = await conn.hostcmd(["inspect", host.data_root, host.model_path or "", *names])
    facts = result.one("host")
    model: ModelIdentity | None = None
    found = facts.get("identity")
    if isinstance(found, dict):
        with contextlib.suppress(HostError):  # the model line says why (does not exist, unreadable)
            model = ModelIdentity.of(host.name, found, weight_version)
    datasets = [{k: v for k, v in r.items() if k != "type"} for r in result.of_type("dataset")]
    return {
        "name": host.name,
        "address": f"{host.address}:{host.port}",
        "ok": True,
        "error": None,
        "retries": conn.retries,
        "seconds": round(time.monotonic() - began, 3),
        "data_root": facts["data_root"],
        "unknown_datasets": facts.get("unknown_datasets", []),
        "datasets": datasets,
        "gpus": facts["gpus"],
        "gpu_error": facts["gpu_error"],
        "disk": facts["disk"],
        "model": facts["model"],
        "model_digest": model.digest if model is not None else None,
        "model_items": [list(item) for item in model.items] if model is not None else None,
        "versions": facts["versions"],
    }


def failed_record(host: HostSettings, exc: HostError, retries: int = 0) -> dict[str, Any]:
    return {
        "name": host.name,
        "address": f"{host.address}:{host.port}",
        "ok": False,
        "state": exc.state,
        "error": str(exc),
        "retries": retries,
        "datasets": [],
        "gpus": [],
        "disk": {},
    }


async def inspect_hosts(
    hosts: Sequence[HostSettings],
    names: Sequence[str] = (),
    *,
    on_change: Callable[[HostConnection], None] | None = None,
    weight_version: str | None = "default",
) -> list[dict[str, Any]]:
    """Every host at once, each over its own connection; a host that fails does not stop the others."""

    async def one(host: HostSettings) -> dict[str, Any]:
        conn = HostConnection(host, on_change=on_change)
        try:
            return await inspect_host(conn, names, weight_version=weight_version)
        except HostError as exc:
            return failed_record(host, exc, conn.retries)
        finally:
            await conn.close()

    return list(await asyncio.gather(*(one(h) for h in hosts)))


def summary(record: dict[str, Any]) -> InspectCounts:
    """What the console's host pane shows of an inspect: datasets, prompts, invalid lines, duplicates."""
    datasets = record.get("datasets") or []
    return {
        "datasets": len(datasets),
        "prompts": sum(d.get("lines", 0) for d in datasets),
        "valid": sum(d.get("valid", 0) for d in datasets),
        "invalid": sum(d.get("invalid_count", 0) for d in datasets),
        "duplicates": sum(d.get("duplicates", 0) for d in datasets),
        "results_rows": sum((d.get("results") or {}).get("rows", 0) for d in datasets),
        "by_dataset": [
            {"name": d.get("name"), "lines": d.get("lines", 0), "invalid": d.get("invalid_count", 0)}
            for d in datasets
        ],
    }


# ---------------------------------------------------------------------------------------------
# Text


def _n(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"


def _bytes(value: Any) -> str:
    if not isinstance(value, int):
        return "?"
    size = float(value)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{value} B"  # pragma: no cover


def _disk(what: str, d: dict[str, Any] | None) -> str | None:
    if not d:
        return None
    if d.get("error"):
        return f"{what} {d.get('path')}: {d['error']}"
    missing = "" if d.get("exists", True) else " (does not exist)"
    return f"{what} {d.get('path')}{missing}: {_bytes(d.get('free_bytes'))} free of {_bytes(d.get('total_bytes'))}"


def _gpu(g: dict[str, Any]) -> str:
    util = g.get("utilization_pct")
    procs = g.get("processes") or []
    line = (
        f"GPU {g.get('index')} {g.get('name')}: {_n(g.get('memory_used_mib'))} / "
        f"{_n(g.get('memory_total_mib'))} MiB, "
        + ("utilisation not reported" if util is None else f"{util}% busy")
    )
    if procs:
        line += "; " + ", ".join(
            f"{p.get('name')} (pid {p.get('pid')}, {_n(p.get('memory_mib'))} MiB)" for p in procs
        )
    return line


def _dataset_lines(d: dict[str, Any]) -> list[str]:
    if d.get("error"):
        return [f"  dataset {d.get('name')} ({d.get('path')}): {d['error']}"]
    chars = d.get("content_chars") or {}
    approx = "" if d.get("content_chars_exact", True) else "~"
    turns = " ".join(f"{k}:{_n(v)}" for k, v in (d.get("turns") or {}).items()) or "none"
    head = (
        f"  dataset {d.get('name')} ({d.get('path')}): {_n(d.get('lines'))} lines, {_n(d.get('valid'))} valid, "
        f"{_n(d.get('invalid_count'))} invalid, {_n(d.get('duplicates'))} duplicate prompts"
    )
    out = [
        head,
        f"    {_bytes(d.get('bytes'))}, sha256 {d.get('sha256')}"
        + ("" if d.get("ends_with_newline", True) else ", last line has no newline"),
        f"    turns {turns}; content chars p50 {approx}{_n(chars.get('p50'))} p90 {approx}{_n(chars.get('p90'))} "
        f"p99 {approx}{_n(chars.get('p99'))}",
    ]
    results = d.get("results")
    if results:
        extra = [
            f"{_n(results[k])} {label}"
            for k, label in (
                ("duplicate_rows", "duplicate rows"),
                ("stray_rows", "rows for no prompt line"),
                ("unreadable_rows", "unreadable rows"),
            )
            if results.get(k)
        ]
        out.append(
            f"    results: {_n(results.get('rows'))} rows covering {_n(results.get('covered'))} of "
            f"{_n(d.get('valid'))} valid prompts" + (f" ({', '.join(extra)})" if extra else "")
        )
    else:
        out.append("    results: none yet")
    if d.get("extra_keys"):
        out.append("    ignored keys: " + ", ".join(f"{k} ({_n(v)})" for k, v in d["extra_keys"].items()))
    if d.get("name_problem"):
        out.append(f"    note: {d['name_problem']}; rename the folder before a run uses it")
    invalid = d.get("invalid") or []
    for bad in invalid[:TEXT_INVALID_LINES]:
        out.append(f"    line {bad['line']}: {bad['reason']}")
    more = (d.get("invalid_count") or 0) - min(len(invalid), TEXT_INVALID_LINES)
    if more > 0:
        out.append(f"    ... and {_n(more)} more invalid lines (--json lists the first {_n(len(invalid))})")
    return out


def format_report(records: Sequence[dict[str, Any]]) -> list[str]:
    """The human form of `regen inspect`."""
    out: list[str] = []
    for r in records:
        if not r.get("ok"):
            out.append(f"{r['name']} ({r['address']}): {r.get('state', 'failed')}: {r.get('error')}")
            continue
        s = summary(r)
        retried = f" (after {r['retries']} reconnects)" if r.get("retries") else ""
        out.append(
            f"{r['name']} ({r['address']}): {s['datasets']} datasets, {_n(s['prompts'])} prompts, "
            f"{_n(s['invalid'])} invalid lines, {_n(s['duplicates'])} duplicate prompts{retried}"
        )
        root = r.get("data_root") or {}
        if root.get("error"):
            out.append(f"  data_root {root.get('path')}: {root['error']}")
        for name in r.get("unknown_datasets") or []:
            out.append(f"  no dataset {name!r} under {root.get('path')}")
        if r.get("gpu_error"):
            out.append(f"  GPUs: {r['gpu_error']}")
        for g in r.get("gpus") or []:
            out.append("  " + _gpu(g))
        disk = r.get("disk") or {}
        for what in ("data_root", "model_path"):
            line = _disk(f"disk under {what}", disk.get(what))
            if line:
                out.append("  " + line)
        model = r.get("model")
        if model:
            if not model.get("exists"):
                out.append(f"  model {model.get('path')}: does not exist")
            else:
                quant = model.get("quantization") or {}
                qtext = ", ".join(
                    f"{k}={v}" for k, v in quant.items() if k in ("quant_method", "format", "bits")
                )
                out.append(
                    f"  model {model.get('path')}: {', '.join(model.get('architectures') or ['?'])} "
                    f"({model.get('model_type')}), quantization {qtext or 'none'}; "
                    f"{model.get('safetensors_files')} safetensors files ({_bytes(model.get('safetensors_bytes'))})"
                )
                out.append(f"  tokenizer files: {', '.join(model.get('tokenizer_files') or []) or 'none'}")
                if r.get("model_digest"):
                    out.append(
                        f'  model digest {r["model_digest"]} (by content: docs/gpu-host.md, "One model")'
                    )
                if model.get("missing_auto_map_files"):
                    out.append(f"  missing (named in auto_map): {', '.join(model['missing_auto_map_files'])}")
                if model.get("error"):
                    out.append(f"  model: {model['error']}")
        v = r.get("versions") or {}
        if v and not v.get("orjson"):
            out.append("  note: this python has no orjson: checking every line runs about 3x slower")
        out.append(
            "  "
            + "; ".join(
                f"{name} {v.get(name) or 'not installed'}"
                for name in ("python", "sglang", "torch", "transformers")
            )
        )
        for d in r.get("datasets") or []:
            out.extend(_dataset_lines(d))
    problem = _one_model(records)
    if problem is not None:
        out.append(f"note: {problem}: one job cannot use both (regen sglang start refuses)")
    return out


def _one_model(records: Sequence[dict[str, Any]]) -> str | None:
    """Why the inspected hosts' models are not one model, or None (docs/gpu-host.md, "One model")."""
    known = [
        ModelIdentity(
            r["name"],
            str((r.get("model") or {}).get("path")),
            tuple((str(n), str(v)) for n, v in r.get("model_items") or []),
            r["model_digest"],
        )
        for r in records
        if r.get("ok") and r.get("model_digest")
    ]
    return mismatch(known)
