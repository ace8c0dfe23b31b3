"""``regen export``: training files from finished rows (docs/data-contract.md §7).

``specforge`` writes SpecForge's pre-tokenized records straight from the stored ``prompt_ids`` and
``output_ids``: nothing is re-rendered, so the reasoning the target really produced is what the
drafter trains on (§6). ``conversations`` writes chat records for trainers that render their own
template; Kimi's template drops reasoning when it renders them, so that format is lossy (§6, §7.2).

Rows stream from ``raw_responses.jsonl`` and records stream to a temporary file in the output's
folder that is fsynced and renamed over the output only when everything succeeded, so a refusal
or a crash never leaves a partial training file behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from array import array
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from regen.engine.data.datasets import RESULTS_FILE, Dataset
from regen.engine.data.jsonl import JsonlError, iter_jsonl
from regen.engine.data.row import BadRow, Row, read_row
from regen.engine.data.validate import validate_line
from regen.engine.errors import RegenError

__all__ = ["FORMATS", "ExportError", "ExportReport", "default_output", "export"]

FORMATS = ("specforge", "conversations")
STATUSES = ("ok", "truncated")

KIMI_REASONING_WARNING = (
    "conversations records are re-rendered by the trainer's chat template; Kimi's template drops "
    "reasoning_content from assistant turns, so the drafter would not see the reasoning tokens "
    "(docs/data-contract.md §6); prefer --format specforge"
)


class ExportError(RegenError, ValueError):
    """The export was refused or failed; nothing was written. One line naming the cause."""


@dataclass(slots=True)
class ExportReport:
    dataset: str
    output: Path
    format: str
    rows: int = 0
    written: int = 0
    dropped_too_long: int = 0
    skipped_status: Counter[str] = field(default_factory=Counter)
    input_tokens: int = 0
    loss_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "output": str(self.output),
            "format": self.format,
            "rows": self.rows,
            "written": self.written,
            "dropped_too_long": self.dropped_too_long,
            "skipped_status": dict(self.skipped_status),
            "input_tokens": self.input_tokens,
            "loss_tokens": self.loss_tokens,
        }


def default_output(dataset: Dataset, fmt: str) -> Path:
    return dataset.folder / f"export.{fmt}.jsonl"


def _file_mode() -> int:
    """What a plain ``open(path, "w")`` would give: 0o666 less the umask (mkstemp uses 0o600)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for text in fh:
                if text.startswith("Umask:"):
                    return 0o666 & ~int(text.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o644


@contextlib.contextmanager
def _atomic_writer(path: Path) -> Iterator[IO[bytes]]:
    """A file that becomes ``path`` only if the block completes; otherwise nothing is left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, _file_mode())
        with os.fdopen(fd, "wb", buffering=1 << 20) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    # The rename is durable only once the folder's entry is on disk too.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class _Seen:
    """One bit per prompt line, grown as lines appear: duplicates would train twice."""

    def __init__(self) -> None:
        self.bits = bytearray()

    def add(self, line: int) -> bool:
        byte, bit = divmod(line, 8)
        if byte >= len(self.bits):
            self.bits.extend(bytes(byte + 1 - len(self.bits) + len(self.bits) // 2))
        if self.bits[byte] >> bit & 1:
            return False
        self.bits[byte] |= 1 << bit
        return True


def _prompt_offsets(dataset: Dataset) -> array[int]:
    offsets = array("Q")
    offset = 0
    with open(dataset.prompts_path, "rb") as fh:
        for raw in fh:
            offsets.append(offset)
            offset += len(raw)
    return offsets


class _Exporter:
    def __init__(
        self,
        fmt: str,
        fh: IO[bytes],
        *,
        statuses: Sequence[str],
        max_length: int | None,
        mask_last_prompt_token: bool,
    ) -> None:
        self.fmt = fmt
        self.fh = fh
        self.statuses = frozenset(statuses)
        self.max_length = max_length
        self.mask_last = mask_last_prompt_token
        self.files_key: bytes | None = None
        self.files_from: str = ""

    def dataset(self, dataset: Dataset, report: ExportReport) -> None:
        seen = _Seen()
        offsets = _prompt_offsets(dataset) if self.fmt == "conversations" else None
        prompts = open(dataset.prompts_path, "rb") if offsets is not None else None  # noqa: SIM115
        try:
            for n, raw in self._rows(dataset):
                where = f"{dataset.name}: {RESULTS_FILE} line {n}"
                report.rows += 1
                status = raw.get("status")
                if status not in self.statuses:
                    report.skipped_status[str(status)] += 1
                    continue
                try:
                    row = read_row(raw, training=True)
                except BadRow as bad:
                    raise ExportError(f"{where}: {bad.problem}; run regen verify") from None
                line = row["line"]
                if not seen.add(line):
                    raise ExportError(f"{where}: second row for prompt line {line}; run regen verify")
                self._check_tokenizer(row, where)
                prompt_ids, output_ids = row["prompt_ids"], row["output_ids"]
                tokens = len(prompt_ids) + len(output_ids)
                if self.max_length is not None and tokens > self.max_length:
                    # Trainers cut from the right, i.e. the supervised answer: drop instead.
                    report.dropped_too_long += 1
                    continue
                if self.fmt == "specforge":
                    record = self._specforge(row, prompt_ids, output_ids, where)
                    report.loss_tokens += sum(record["loss_mask"])
                else:
                    assert offsets is not None and prompts is not None
                    record = self._conversation(row, line, offsets, prompts, where)
                    report.loss_tokens += len(output_ids)
                report.input_tokens += tokens
                self.fh.write(orjson.dumps(record))
                self.fh.write(b"\n")
                report.written += 1
        finally:
            if prompts is not None:
                prompts.close()

    @staticmethod
    def _rows(dataset: Dataset) -> Iterator[tuple[int, dict[str, Any]]]:
        try:
            yield from iter_jsonl(dataset.results_path)
        except JsonlError as exc:
            raise ExportError(str(exc)) from None

    def _check_tokenizer(self, row: Row, where: str) -> None:
        tok = row.get("tokenizer")
        files = tok.get("files_sha256") if isinstance(tok, dict) else None
        if not isinstance(files, dict):
            return
        key = orjson.dumps(files, option=orjson.OPT_SORT_KEYS)
        if self.files_key is None:
            self.files_key, self.files_from = key, where
        elif key != self.files_key:
            raise ExportError(
                f"{where}: tokenizer files differ from those of {self.files_from}; "
                "one training file must come from one tokenizer"
            )

    def _specforge(
        self, row: Row, prompt_ids: list[int], output_ids: list[int], where: str
    ) -> dict[str, Any]:
        if not prompt_ids or not output_ids:
            raise ExportError(
                f"{where}: row has no token ids (written before a tokenizer was configured); "
                "specforge needs them"
            )
        mask = [0] * len(prompt_ids) + [1] * len(output_ids)
        if self.mask_last:
            # SpecForge #885: the EAGLE-3 head shifts ids but not the mask, losing the first
            # answer position unless the mask starts one token earlier.
            mask[len(prompt_ids) - 1] = 1
        return {"id": row["id"], "input_ids": prompt_ids + output_ids, "loss_mask": mask}

    @staticmethod
    def _conversation(
        row: Row, line: int, offsets: array[int], prompts: IO[bytes], where: str
    ) -> dict[str, Any]:
        if line >= len(offsets):
            raise ExportError(f"{where}: prompt line {line} does not exist; run regen verify")
        prompts.seek(offsets[line])
        prompt = validate_line(prompts.readline())
        if isinstance(prompt, str):
            raise ExportError(f"{where}: prompt line {line} is invalid ({prompt}); run regen verify")
        if prompt.sha256 != row["prompt_sha256"]:
            raise ExportError(
                f"{where}: prompt line {line} changed since the row was written; run regen verify"
            )
        reply = {"role": "assistant", "content": row["content"], "reasoning_content": row["reasoning"]}
        return {"id": row["id"], "conversations": [*prompt.messages, reply]}


def export(
    datasets: Sequence[Dataset],
    fmt: str,
    *,
    output: Path | None = None,
    statuses: Sequence[str] = ("ok",),
    max_length: int | None = None,
    mask_last_prompt_token: bool = False,
) -> list[ExportReport]:
    """Write ``fmt`` records for ``datasets``: each to ``<dataset>/export.<fmt>.jsonl``, or all to ``output``."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")
    unknown = sorted(set(statuses) - set(STATUSES))
    if unknown or not statuses:
        raise ExportError(f"unknown status {', '.join(unknown) or '(none)'} (use ok, truncated)")
    if max_length is not None and max_length < 1:
        raise ExportError("max length must be at least 1")
    options = {
        "statuses": statuses,
        "max_length": max_length,
        "mask_last_prompt_token": mask_last_prompt_token,
    }
    for ds in datasets:
        if not ds.results_path.exists():
            raise ExportError(f"{ds.folder}: no {RESULTS_FILE} to export")
    reports: list[ExportReport] = []
    if output is not None:
        with _atomic_writer(output) as fh:
            exporter = _Exporter(fmt, fh, **options)  # type: ignore[arg-type]
            for ds in datasets:
                report = ExportReport(ds.name, output, fmt)
                exporter.dataset(ds, report)
                reports.append(report)
        return reports
    for ds in datasets:
        path = default_output(ds, fmt)
        report = ExportReport(ds.name, path, fmt)
        with _atomic_writer(path) as fh:
            _Exporter(fmt, fh, **options).dataset(ds, report)  # type: ignore[arg-type]
        reports.append(report)
    return reports
