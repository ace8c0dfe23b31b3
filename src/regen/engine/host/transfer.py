"""`regen pull` and `regen push` over SFTP: verified by sha256, resumable, never clobbering.

Pull (docs/gpu-host.md, "Pull and push"): each file goes to a hidden ``.NAME.<sha>.part`` beside
its destination, named after the host file's sha256, so an interrupted pull picks up where it
stopped and a host file that changed meanwhile starts a fresh part. Only a part whose sha256
matches the host's is fsynced and renamed into place. A destination that exists and differs is
never replaced.

Push: a host's ``raw_responses.jsonl`` is only ever appended to. When it is a prefix of the local
file (compared by sha256 of the host file against the local file's first as many bytes), the
missing tail is written after it; when it differs otherwise, or is longer, the push is refused.
A new file is written to a temporary name and renamed without replacing anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import asyncssh

from regen.engine.config.settings import HostSettings
from regen.engine.config.workspace import datasets_dir, tokenizer_dir
from regen.engine.data.datasets import PROMPTS_FILE, RESULTS_FILE
from regen.engine.host.errors import HostError, TransferError
from regen.engine.host.ssh import HostConnection

CHUNK = 4 << 20
PUSH_TMP_SUFFIX = ".regen-push.tmp"


@dataclass(slots=True)
class Outcome:
    """What happened to one file: ``action`` is pulled, resumed, up to date, appended, created or refused;
    ``bytes`` is what this run sent over the connection."""

    what: str
    action: str
    detail: str = ""
    bytes: int = 0
    ok: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.what,
            "action": self.action,
            "detail": self.detail,
            "bytes": self.bytes,
            "ok": self.ok,
        }


@dataclass(slots=True)
class Report:
    host: str
    outcomes: list[Outcome] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "ok": self.ok,
            "files": [o.to_dict() for o in self.outcomes],
            "warnings": self.warnings,
        }


# ---------------------------------------------------------------------------------------------
# Local files


def sha256_file(path: Path, limit: int | None = None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        left = limit
        while left is None or left > 0:
            chunk = f.read(CHUNK if left is None else min(CHUNK, left))
            if not chunk:
                break
            digest.update(chunk)
            if left is not None:
                left -= len(chunk)
    return digest.hexdigest()


def whole_lines_size(path: Path) -> int:
    """Bytes up to and including the file's last newline: what a push may send (whole rows only)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        pos = size
        while pos > 0:
            step = min(1 << 16, pos)
            f.seek(pos - step)
            block = f.read(step)
            nl = block.rfind(b"\n")
            if nl >= 0:
                return pos - step + nl + 1
            pos -= step
    return 0


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# Pull


async def _digests(conn: HostConnection, paths: Sequence[str]) -> list[dict[str, Any]]:
    if not paths:
        return []
    argv = ["digest"]
    for p in paths:
        argv += [p, ""]
    return (await conn.hostcmd(argv)).of_type("digest")


def _part_path(dest: Path, sha256: str) -> Path:
    return dest.with_name(f".{dest.name}.{sha256[:16]}.part")


async def pull_file(
    conn: HostConnection, remote: str, size: int, sha256: str, dest: Path, label: str
) -> Outcome:
    """One host file to ``dest``, resuming a part left by an earlier try; verified before the rename."""
    if dest.exists():
        local = await asyncio.to_thread(sha256_file, dest)
        if local == sha256:
            return Outcome(label, "up to date")
        return Outcome(
            label,
            "refused",
            f"{dest} exists and differs from the host's file (sha256 {local[:16]} here, {sha256[:16]} there); "
            "a pulled file is never replaced: move it away to pull again",
            ok=False,
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = _part_path(dest, sha256)
    for stale in dest.parent.glob(f".{dest.name}.*.part"):
        if stale != part:
            stale.unlink()
    start = part.stat().st_size if part.exists() else 0
    if start > size:
        part.unlink()
        start = 0

    copied = 0

    async def copy(ssh: asyncssh.SSHClientConnection) -> None:
        nonlocal copied
        # Each try (after a dropped connection too) continues from what the part already holds.
        offset = part.stat().st_size if part.exists() else 0
        async with ssh.start_sftp_client() as sftp, sftp.open(remote, "rb") as src:
            with open(part, "ab") as out:
                while offset < size:
                    block = cast(bytes, await src.read(min(CHUNK, size - offset), offset))
                    if not block:
                        raise TransferError(f"{label}: the host file ended at {offset} of {size} bytes")
                    out.write(block)
                    out.flush()
                    offset += len(block)
                    copied += len(block)
                os.fsync(out.fileno())

    await conn.run(copy, f"pull of {label}")
    got = await asyncio.to_thread(sha256_file, part)
    if got != sha256:
        part.unlink()
        return Outcome(
            label,
            "refused",
            f"sha256 of the copy {got[:16]} is not the host's {sha256[:16]}; removed, pull again",
            ok=False,
        )
    os.replace(part, dest)
    _fsync_dir(dest.parent)
    return Outcome(label, "resumed" if start else "pulled", f"from byte {start:,}" if start else "", copied)


async def _manifest(conn: HostConnection, mode: str, names: Sequence[str]) -> dict[str, Any]:
    """The host's datasets (and, for a pull, tokenizer files) with sizes and sha256, in one call."""
    host = conn.host
    result = await conn.hostcmd(["manifest", host.data_root, host.model_path or "", mode, *names])
    manifest = result.one("manifest")
    root = manifest["data_root"]
    if root.get("error"):
        raise TransferError(f"{host.name}: data_root {root['path']} {root['error']}")
    if manifest["unknown_datasets"]:
        raise TransferError(
            f"{host.name}: no dataset {', '.join(map(repr, manifest['unknown_datasets']))} under {root['path']} "
            f"(found: {', '.join(manifest['found']) or 'none'})"
        )
    return manifest


async def pull(
    conn: HostConnection,
    workspace: Path,
    names: Sequence[str] = (),
    *,
    on_outcome: Callable[[Outcome], None] | None = None,
) -> Report:
    """Datasets (all, or ``names``) to ``<workspace>/datasets`` and the tokenizer files to ``<workspace>/tokenizer``."""
    host = conn.host
    report = Report(host.name)

    def done(outcome: Outcome) -> None:
        report.outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)

    manifest = await _manifest(conn, "pull", names)
    for ds in manifest["datasets"]:
        if ds["name_problem"]:
            report.warnings.append(
                f"{ds['name']}: {ds['name_problem']}; rename its folder under {datasets_dir(workspace)} before a run"
            )
        digest = ds["prompts"]
        dest = datasets_dir(workspace) / ds["name"] / PROMPTS_FILE
        done(
            await pull_file(
                conn, digest["path"], digest["bytes"], digest["sha256"], dest, f"{ds['name']}/{PROMPTS_FILE}"
            )
        )
    await _pull_tokenizer(conn, workspace, manifest.get("tokenizer"), report, done)
    return report


async def _pull_tokenizer(
    conn: HostConnection,
    workspace: Path,
    tokenizer: dict[str, Any] | None,
    report: Report,
    done: Callable[[Outcome], None],
) -> None:
    """The model folder's tokenizer files, as the manifest lists them, to ``<workspace>/tokenizer``."""
    host = conn.host
    if not host.model_path:
        report.warnings.append(f"{host.name}: no model_path set, so no tokenizer files were pulled")
    elif not tokenizer or not tokenizer.get("exists"):
        report.warnings.append(
            f"{host.name}: model_path {host.model_path} does not exist; no tokenizer files pulled"
        )
    else:
        for name in tokenizer.get("missing") or []:
            report.warnings.append(f"{host.name}: {name} is named in auto_map but not in {tokenizer['path']}")
        for f in tokenizer.get("files") or []:
            # The name comes from a fixed list or a checked module name (probe.py), never a path.
            dest = tokenizer_dir(workspace) / Path(f["name"]).name
            done(await pull_file(conn, f["path"], f["bytes"], f["sha256"], dest, f"tokenizer/{f['name']}"))


async def pull_tokenizer(
    conn: HostConnection, workspace: Path, *, on_outcome: Callable[[Outcome], None] | None = None
) -> Report:
    """Only the tokenizer files, as `pull` brings them (sha256-verified, resumable): what a run with
    SGLang and no tokenizer fetches before it starts. No dataset is read on the host."""
    host = conn.host
    report = Report(host.name)

    def done(outcome: Outcome) -> None:
        report.outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)

    result = await conn.hostcmd(["manifest", host.data_root, host.model_path or "", "tokenizer"])
    await _pull_tokenizer(conn, workspace, result.one("manifest").get("tokenizer"), report, done)
    return report


async def fetch_tokenizer(
    hosts: Sequence[HostSettings],
    workspace: Path,
    *,
    on_change: Callable[[HostConnection], None] | None = None,
) -> Report:
    """The tokenizer files from the first of ``hosts`` (those with a model_path, in order) that
    answers, into ``<workspace>/tokenizer``; raises TransferError with the last host's reason when
    none does. Files already there and equal are left as they are (``up to date``)."""
    failures: list[str] = []
    for host in hosts:
        if not host.model_path:
            continue
        conn = HostConnection(host, on_change=on_change)
        try:
            return await pull_tokenizer(conn, workspace)
        except HostError as exc:
            failures.append(str(exc))
        finally:
            await conn.close()
    if not failures:
        raise TransferError("no [[hosts]] table has a model_path to fetch the tokenizer from")
    raise TransferError(f"cannot fetch the tokenizer: {failures[-1]}")


# ---------------------------------------------------------------------------------------------
# Push


async def push(
    conn: HostConnection,
    workspace: Path,
    names: Sequence[str] = (),
    *,
    on_outcome: Callable[[Outcome], None] | None = None,
) -> Report:
    """Each local ``raw_responses.jsonl`` (all datasets, or ``names``) to its dataset on the host, by appending."""
    host = conn.host
    report = Report(host.name)
    root = datasets_dir(workspace)
    local = {
        p.name: p
        for p in sorted(root.iterdir() if root.is_dir() else [])
        if p.is_dir() and (p / RESULTS_FILE).is_file()
    }
    unknown = [n for n in names if n not in local]
    if unknown:
        raise TransferError(
            f"no {RESULTS_FILE} for {', '.join(map(repr, unknown))} under {root} (found: {', '.join(local) or 'none'})"
        )
    chosen = list(names) or list(local)
    if not chosen:
        report.warnings.append(f"nothing to push: no dataset under {root} has a {RESULTS_FILE}")
        return report
    manifest = await _manifest_for_push(conn, chosen)
    remote = {d["name"]: d for d in manifest["datasets"]}
    for name in chosen:
        outcome = await _push_one(conn, name, local[name], remote.get(name), manifest["data_root"]["path"])
        report.outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)
    return report


async def _manifest_for_push(conn: HostConnection, names: Sequence[str]) -> dict[str, Any]:
    # A dataset the host lacks is refused per dataset below, not for the whole push.
    host = conn.host
    result = await conn.hostcmd(["manifest", host.data_root, host.model_path or "", "push", *names])
    manifest = result.one("manifest")
    if manifest["data_root"].get("error"):
        raise TransferError(
            f"{host.name}: data_root {manifest['data_root']['path']} {manifest['data_root']['error']}"
        )
    return manifest


async def _push_one(
    conn: HostConnection, name: str, folder: Path, remote: dict[str, Any] | None, root: str
) -> Outcome:
    label = f"{name}/{RESULTS_FILE}"
    if remote is None:
        return Outcome(label, "refused", f"the host has no dataset {name!r} under {root}", ok=False)
    results = folder / RESULTS_FILE
    length = await asyncio.to_thread(whole_lines_size, results)
    local_sha = await asyncio.to_thread(sha256_file, results, length)
    prompts_here = folder / PROMPTS_FILE
    there_prompts, there = remote["prompts"], remote["results"]
    target = there["path"]
    if prompts_here.is_file():
        here_prompts = await asyncio.to_thread(sha256_file, prompts_here)
        if here_prompts != there_prompts.get("sha256"):
            return Outcome(
                label,
                "refused",
                f"the local {PROMPTS_FILE} (sha256 {here_prompts[:16]}) is not the host's "
                f"({str(there_prompts.get('sha256'))[:16]}): these results belong to other prompts",
                ok=False,
            )
    if not there.get("exists"):
        return await _push_new(conn, label, results, length, local_sha, target)
    size = int(there["bytes"])
    if size > length:
        return Outcome(
            label,
            "refused",
            f"the host's file is longer ({size:,} bytes) than the local one ({length:,} bytes of whole rows); "
            "it is never truncated: pull or merge it by hand",
            ok=False,
        )
    prefix = await asyncio.to_thread(sha256_file, results, size)
    if prefix != there["sha256"]:
        return Outcome(
            label,
            "refused",
            f"the host's file ({size:,} bytes) is not a prefix of the local one: they differ within its "
            "first bytes, so appending would mix two histories; nothing was written",
            ok=False,
        )
    if size == length:
        return Outcome(label, "up to date", f"{size:,} bytes")
    return await _append(conn, label, results, size, length, local_sha, target)


async def _append(
    conn: HostConnection, label: str, results: Path, start: int, length: int, local_sha: str, target: str
) -> Outcome:
    async def write(ssh: asyncssh.SSHClientConnection) -> None:
        async with ssh.start_sftp_client() as sftp, sftp.open(target, "r+b") as out:
            # Where the host file ends now: after a drop, a retry continues from there.
            offset = (await out.stat()).size or 0
            if offset < start or offset > length:
                raise TransferError(
                    f"{label}: the host's file changed size during the push ({offset:,} bytes)"
                )
            with open(results, "rb") as src:
                src.seek(offset)
                while offset < length:
                    block = src.read(min(CHUNK, length - offset))
                    await out.write(block, offset)
                    offset += len(block)
            await _fsync_remote(out)

    await conn.run(write, f"push of {label}")
    after = (await _digests(conn, [target]))[0]
    if after.get("sha256") != local_sha:
        return Outcome(
            label, "refused", "after appending, the host's sha256 is not the local file's", ok=False
        )
    return Outcome(label, "appended", f"{length - start:,} bytes after the host's {start:,}", length - start)


async def _push_new(
    conn: HostConnection, label: str, results: Path, length: int, local_sha: str, target: str
) -> Outcome:
    tmp = target + PUSH_TMP_SUFFIX

    async def write(ssh: asyncssh.SSHClientConnection) -> None:
        # The temporary file is regen's own: a retry after a drop writes it again from the start.
        async with ssh.start_sftp_client() as sftp, sftp.open(tmp, "wb") as out:
            with open(results, "rb") as src:
                offset = 0
                while offset < length:
                    block = src.read(min(CHUNK, length - offset))
                    await out.write(block, offset)
                    offset += len(block)
            await _fsync_remote(out)

    async def rename(ssh: asyncssh.SSHClientConnection) -> str | None:
        async with ssh.start_sftp_client() as sftp:
            if not ok:
                await sftp.remove(tmp)
                return None
            # SFTP's plain rename refuses to replace an existing file: one that appeared meanwhile is kept.
            try:
                await sftp.rename(tmp, target)
            except asyncssh.SFTPError as exc:
                await sftp.remove(tmp)
                return str(exc)
            return None

    await conn.run(write, f"push of {label}")
    after = (await _digests(conn, [tmp]))[0]
    ok = after.get("sha256") == local_sha
    refused = await conn.run(rename, f"push of {label}")
    if not ok:
        return Outcome(label, "refused", "the copy on the host did not match (sha256); removed it", ok=False)
    if refused is not None:
        return Outcome(
            label,
            "refused",
            f"the host's file appeared during the push; nothing replaced ({refused})",
            ok=False,
        )
    return Outcome(label, "created", f"{length:,} bytes", length)


async def _fsync_remote(f: asyncssh.SFTPClientFile) -> None:
    # fsync@openssh.com: OpenSSH's sftp-server has it; without it the host's own flush must do.
    with contextlib.suppress(asyncssh.SFTPOpUnsupported):
        await f.fsync()
