"""``regen verify``: check every result row against its prompt and the data contract's invariants.

One streaming pass over ``prompts.jsonl`` keeps, per prompt line, 8 bytes of its hash (and 8 of its
offset when prompts are re-rendered); one streaming pass over ``raw_responses.jsonl`` checks each
row as it is read, decoding token ids in batches. Memory per dataset is a few bytes per prompt
line, never the rows' ids, so datasets of millions of rows verify in bounded memory.

The rules are docs/data-contract.md §4; each violation names the dataset, the row's line in
``raw_responses.jsonl`` (0-based, like prompt lines) and the rule. Nothing is written.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from regen.engine.data.contract import is_degenerate
from regen.engine.data.datasets import PROMPTS_FILE, RESULTS_FILE, Dataset
from regen.engine.data.jsonl import JsonlError, iter_jsonl
from regen.engine.data.row import BadRow, Row, Usage, read_row
from regen.engine.data.tokenizer import THINK, THINK_END, TargetTokenizer
from regen.engine.data.validate import validate_line

__all__ = ["RULES", "DatasetReport", "Violation", "verify_dataset"]

# Rule name -> what it means; the names are what reports and tests refer to.
RULES = {
    "schema": "a required field is missing or has the wrong type",
    "duplicate_row": "more than one row for one prompt line",
    "orphan_row": "a row for a line that is not a valid prompt in prompts.jsonl",
    "prompt_changed": "prompt_sha256 differs from the hash of the line now in prompts.jsonl",
    "status_finish": "status ok needs finish_reason stop, truncated needs length",
    "count_mismatch": "num_prompt_tokens / num_output_tokens differ from the lengths of the id lists",
    "not_tokenized": "the row has no token ids (only with --require-ids)",
    "mixed_tokenizers": "rows of one dataset carry different tokenizer files_sha256",
    "tokenizer_mismatch": "the rows' tokenizer files differ from the tokenizer given to verify",
    "no_terminator": "an ok row does not end with the end-of-turn id",
    "truncated_terminated": "a truncated row ends with the end-of-turn id",
    "think_end_count": "a thinking ok row does not hold the </think> id exactly once",
    "think_in_output": "output_ids hold the <think> id (it belongs to the prompt)",
    "prompt_suffix": "prompt_ids do not end with the template's generation prompt",
    "prompt_render": "prompt_ids differ from a fresh render of the prompt (--check-prompts)",
    "decode_mismatch": "decode(output_ids) differs from the text the row holds",
    "special_in_text": "reasoning or content holds a special-token string",
    "server_count": "server ids: len(output_ids) != the server's completion_tokens (+1 if terminator appended)",
    "cost_exceeds_journal": "the rows' cost adds up to more than the attempt journal's spend",
}

_DECODE_BATCH = 512
_NO_ROW = -1


@dataclass(slots=True)
class Violation:
    dataset: str
    row: int  # line in raw_responses.jsonl
    line: int | None  # prompt line the row claims
    rule: str
    message: str

    def __str__(self) -> str:
        where = f"{RESULTS_FILE} line {self.row}"
        if self.line is not None:
            where += f" (prompt line {self.line})"
        return f"{self.dataset}: {where}: {self.rule}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"row": self.row, "line": self.line, "rule": self.rule, "message": self.message}


@dataclass(slots=True)
class DatasetReport:
    name: str
    folder: Path
    prompts: int = 0
    invalid_prompts: int = 0
    rows: int = 0
    ok: int = 0
    truncated: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    native_completion_tokens: int = 0
    cost: float = 0.0
    rows_without_cost: int = 0
    journal_spend: float | None = None
    covered: int = 0  # prompt lines with a row
    not_tokenized: int = 0
    decoded: int = 0
    tokenizer_hashes: int = 0
    tokenizer_checked: bool = False
    violations: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[Violation]] = field(default_factory=dict)
    flags: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    examples_per_rule: int = 5

    @property
    def missing(self) -> int:
        """Valid prompts with no row yet: not a violation (the job may still be running)."""
        return max(0, self.prompts - self.invalid_prompts - self.covered)

    @property
    def failed(self) -> bool:
        return bool(self.violations)

    def add(self, row: int, line: int | None, rule: str, message: str) -> None:
        self.violations[rule] += 1
        shown = self.examples.setdefault(rule, [])
        if len(shown) < self.examples_per_rule:
            shown.append(Violation(self.name, row, line, rule, message))

    def to_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.name,
            "folder": str(self.folder),
            "prompts": self.prompts,
            "invalid_prompts": self.invalid_prompts,
            "rows": self.rows,
            "ok": self.ok,
            "truncated": self.truncated,
            "missing": self.missing,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "native_completion_tokens": self.native_completion_tokens,
            "cost": round(self.cost, 10),
            "rows_without_cost": self.rows_without_cost,
            "journal_spend": self.journal_spend,
            "not_tokenized": self.not_tokenized,
            "decoded": self.decoded,
            "tokenizer_checked": self.tokenizer_checked,
            "violations": dict(self.violations),
            "examples": {rule: [v.to_dict() for v in vs] for rule, vs in self.examples.items()},
            "flags": dict(self.flags),
            "notes": list(self.notes),
            "ok_overall": not self.failed,
        }


# ---------------------------------------------------------------------------------------------
# Prompts: hash prefix (and offset) per line


@dataclass(slots=True)
class _PromptIndex:
    # First 8 bytes of each valid line's sha256; 0 marks an invalid line (a real 0 is 2^-64 likely).
    hashes: array[int]
    offsets: array[int] | None
    invalid: int


def _hash_key(sha_hex: str) -> int:
    try:
        return int(sha_hex[:16], 16) or 1
    except ValueError:
        return -1


def _index_prompts(dataset: Dataset, with_offsets: bool) -> _PromptIndex:
    hashes = array("Q")
    offsets = array("Q") if with_offsets else None
    invalid = 0
    offset = 0
    with open(dataset.prompts_path, "rb") as fh:
        for n, raw in enumerate(fh):
            prompt = validate_line(raw, dataset.name, n)
            if isinstance(prompt, str):
                hashes.append(0)
                invalid += 1
            else:
                hashes.append(_hash_key(prompt.sha256))
            if offsets is not None:
                offsets.append(offset)
            offset += len(raw)
    return _PromptIndex(hashes, offsets, invalid)


def _read_messages(fh: Any, offset: int) -> list[dict[str, Any]] | None:
    fh.seek(offset)
    prompt = validate_line(fh.readline())
    return None if isinstance(prompt, str) else prompt.messages


# ---------------------------------------------------------------------------------------------
# Rows


def _row_thinking(row: Row) -> bool:
    tok = row.get("tokenizer")
    if isinstance(tok, dict):
        kwargs = tok.get("template_kwargs")
        if isinstance(kwargs, dict) and "thinking" in kwargs:
            return bool(kwargs["thinking"])
    request = row.get("request")
    return bool(isinstance(request, dict) and request.get("thinking"))


def _files_key(row: Row) -> bytes | None:
    tok = row.get("tokenizer")
    if not isinstance(tok, dict) or not isinstance(tok.get("files_sha256"), dict):
        return None
    return orjson.dumps(tok["files_sha256"], option=orjson.OPT_SORT_KEYS)


class _Checker:
    """Per-dataset state of the row pass."""

    def __init__(
        self,
        dataset: Dataset,
        report: DatasetReport,
        index: _PromptIndex,
        tokenizer: TargetTokenizer | None,
        *,
        require_ids: bool,
        check_prompts: bool,
    ) -> None:
        self.dataset = dataset
        self.report = report
        self.index = index
        self.tokenizer = tokenizer
        self.require_ids = require_ids
        self.check_prompts = check_prompts and tokenizer is not None and index.offsets is not None
        self.first_row = array("q", [_NO_ROW]) * len(index.hashes)
        self.hashes_seen: dict[bytes, int] = {}
        self.first_hash: bytes | None = None
        self.tokenizer_key = (
            orjson.dumps(tokenizer.files_sha256, option=orjson.OPT_SORT_KEYS) if tokenizer else None
        )
        specials = tokenizer.special_strings if tokenizer else frozenset({THINK, THINK_END, "<|im_end|>"})
        self.special_re = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))
        self.pending: list[tuple[int, int, list[int], list[str]]] = []
        self.suffix: dict[bool, list[int]] = {}
        self.prompts_fh = open(dataset.prompts_path, "rb") if self.check_prompts else None  # noqa: SIM115

    def close(self) -> None:
        self.flush()
        if self.prompts_fh is not None:
            self.prompts_fh.close()

    def row(self, n: int, raw: dict[str, Any]) -> None:
        """Row `n` of raw_responses.jsonl against every rule of docs/data-contract.md §4 that applies."""
        self.report.rows += 1
        row = self._schema(n, raw)
        if row is None:
            return
        line = row["line"]
        if not self._identity(n, line, row):
            return
        status, finish = row["status"], row["finish_reason"]
        prompt_ids, output_ids = row["prompt_ids"], row["output_ids"]
        self._status(n, line, status, finish)
        self._counts(n, line, row, prompt_ids, output_ids)
        usage = self._money(row)
        thinking = _row_thinking(row)
        self._flags(row, status, thinking)
        self._specials(n, line, row)
        if not output_ids and not prompt_ids:
            self.report.not_tokenized += 1
            if self.require_ids:
                self.report.add(n, line, "not_tokenized", "no prompt_ids or output_ids")
            return
        files_key = self._tokenizer_files(n, line, row)
        if self.tokenizer is None or files_key is None or files_key != self.tokenizer_key:
            return
        self._check_ids(n, line, row, status, finish, thinking, usage, prompt_ids, output_ids)

    def _schema(self, n: int, raw: dict[str, Any]) -> Row | None:
        """The row as the training fields and their types allow it to be read (engine/data/row.py
        `read_row`), its dataset and its id; None: nothing else can be read."""
        report = self.report
        try:
            row = read_row(raw, training=True)
        except BadRow as bad:
            line = raw.get("line")
            report.add(n, line if type(line) is int else None, "schema", bad.problem)
            return None
        line = row["line"]
        if row["dataset"] != self.dataset.name:
            report.add(n, line, "schema", f"dataset {row['dataset']!r} in the rows of {self.dataset.name!r}")
        if row["id"] != f"{self.dataset.name}-{line:08d}":
            report.add(n, line, "schema", f"id {row['id']!r} does not match dataset and line")
        return row

    def _identity(self, n: int, line: int, row: Row) -> bool:
        """§4.1: the row's prompt line exists, has no earlier row, and is the prompt it was made from;
        False: an orphan or a duplicate, checked no further."""
        report = self.report
        hashes = self.index.hashes
        if line < 0 or line >= len(hashes) or hashes[line] == 0:
            what = "beyond the end of" if line >= len(hashes) or line < 0 else "an invalid line of"
            report.add(n, line, "orphan_row", f"line {line} is {what} {PROMPTS_FILE} ({len(hashes)} lines)")
            return False
        first = self.first_row[line]
        if first != _NO_ROW:
            report.add(
                n,
                line,
                "duplicate_row",
                f"prompt line {line} already has a row at {RESULTS_FILE} line {first}",
            )
            return False
        self.first_row[line] = n
        report.covered += 1
        if _hash_key(row["prompt_sha256"]) != hashes[line]:
            report.add(
                n, line, "prompt_changed", "prompt_sha256 does not match the line now in prompts.jsonl"
            )
        return True

    def _status(self, n: int, line: int, status: str, finish: str) -> None:
        """§4.2: ok goes with finish_reason stop, truncated with length."""
        report = self.report
        if status == "ok":
            report.ok += 1
            if finish != "stop":
                report.add(n, line, "status_finish", f"status ok with finish_reason {finish!r}")
        elif status == "truncated":
            report.truncated += 1
            if finish != "length":
                report.add(n, line, "status_finish", f"status truncated with finish_reason {finish!r}")
        else:
            report.add(n, line, "status_finish", f"status {status!r} is neither ok nor truncated")

    def _counts(self, n: int, line: int, row: Row, prompt_ids: list[int], output_ids: list[int]) -> None:
        """§4.3: the token counts are the lengths of the id lists."""
        report = self.report
        if row["num_prompt_tokens"] != len(prompt_ids):
            report.add(
                n,
                line,
                "count_mismatch",
                f"num_prompt_tokens {row['num_prompt_tokens']} != {len(prompt_ids)} ids",
            )
        if row["num_output_tokens"] != len(output_ids):
            report.add(
                n,
                line,
                "count_mismatch",
                f"num_output_tokens {row['num_output_tokens']} != {len(output_ids)} ids",
            )
        report.prompt_tokens += len(prompt_ids)
        report.output_tokens += len(output_ids)

    def _money(self, row: Row) -> Usage:
        """The row's dollars and the backend's own token count into the totals; a GPU-time row has
        no dollars (docs/money.md). The row's usage ({} when it has none)."""
        report = self.report
        cost = row.get("cost")
        if cost is None:
            report.rows_without_cost += 1
        else:
            report.cost += cost
        usage = row["usage"]
        completion = usage.get("completion_tokens")
        if completion is not None:
            report.native_completion_tokens += completion
        return usage

    def _flags(self, row: Row, status: str, thinking: bool) -> None:
        """§4.11: quality flags, counted, never failed."""
        flags = self.report.flags
        if thinking and not row["reasoning"]:
            flags["empty_reasoning"] += 1
        if is_degenerate(row["content"]):
            flags["degenerate_content"] += 1
        if status == "ok" and not row["content"]:
            flags["empty_content"] += 1

    def _specials(self, n: int, line: int, row: Row) -> None:
        """§4.8, the half that needs no ids: no special-token string in the text."""
        for name in ("reasoning", "content"):
            found = self.special_re.search(row[name])
            if found:
                self.report.add(
                    n, line, "special_in_text", f"{name} holds {found.group()!r} at character {found.start()}"
                )

    def _tokenizer_files(self, n: int, line: int, row: Row) -> bytes | None:
        """§4.9: one tokenizer per dataset, and the one given to verify; the row's tokenizer files
        key, None when the row has ids but no tokenizer block (a schema violation)."""
        report = self.report
        files_key = _files_key(row)
        if files_key is None:
            report.add(n, line, "schema", "ids without a tokenizer block with files_sha256")
            return None
        if files_key not in self.hashes_seen:
            self.hashes_seen[files_key] = n
            if self.first_hash is None:
                self.first_hash = files_key
            else:
                report.add(
                    n,
                    line,
                    "mixed_tokenizers",
                    f"tokenizer files differ from those of {RESULTS_FILE} line {self.hashes_seen[self.first_hash]}",
                )
            if self.tokenizer_key is not None and files_key != self.tokenizer_key:
                report.add(
                    n, line, "tokenizer_mismatch", "the row's tokenizer files differ from the tokenizer given"
                )
        return files_key

    def _check_ids(
        self,
        n: int,
        line: int,
        row: Row,
        status: str,
        finish: str,
        thinking: bool,
        usage: Usage,
        prompt_ids: list[int],
        output_ids: list[int],
    ) -> None:
        tokenizer, report = self.tokenizer, self.report
        assert tokenizer is not None
        if thinking and tokenizer.think_end_id is None:
            report.add(
                n, line, "tokenizer_mismatch", f"a thinking row, but the tokenizer has no {THINK_END} token"
            )
            return
        eot = tokenizer.end_of_turn_id
        last = output_ids[-1] if output_ids else None
        # §4.5
        if status == "ok" and last != eot:
            report.add(
                n, line, "no_terminator", f"ok row ends with {last} instead of the end-of-turn id {eot}"
            )
        if status == "truncated" and last == eot:
            report.add(n, line, "truncated_terminated", f"truncated row ends with the end-of-turn id {eot}")
        # §4.6
        if tokenizer.think_id is not None and tokenizer.think_id in output_ids:
            report.add(n, line, "think_in_output", f"output_ids hold the {THINK} id {tokenizer.think_id}")
        if thinking and status == "ok" and tokenizer.think_end_id is not None:
            count = output_ids.count(tokenizer.think_end_id)
            if count != 1:
                report.add(n, line, "think_end_count", f"{THINK_END} id occurs {count} times in output_ids")
        # §4.4
        completion = usage.get("completion_tokens")
        if row.get("output_ids_source") == "server" and completion is not None:
            # The server's own ids are what it counted (the terminator regen appends aside).
            expected = completion + (1 if row.get("terminator_appended") else 0)
            if len(output_ids) != expected:
                report.add(n, line, "server_count", f"{len(output_ids)} output ids, expected {expected}")
        # §4.7
        suffix = self._suffix(thinking)
        if suffix and prompt_ids[-len(suffix) :] != suffix:
            report.add(
                n,
                line,
                "prompt_suffix",
                f"prompt_ids end with {prompt_ids[-len(suffix) :]}, expected {suffix}",
            )
        if self.prompts_fh is not None and self.index.offsets is not None:
            messages = _read_messages(self.prompts_fh, self.index.offsets[line])
            if messages is not None and tokenizer.prompt_ids(messages) != prompt_ids:
                report.add(n, line, "prompt_render", "prompt_ids differ from a fresh render of the line")
        # §4.8: the decoded ids must be exactly the row's text (two readings for the ambiguous case).
        reasoning, content = row["reasoning"], row["content"]
        if finish not in ("stop", "length"):
            return
        text, append = tokenizer.output_text(reasoning, content, finish, thinking)
        expected_texts = [text + (tokenizer.end_of_turn_text if append else "")]
        if thinking and finish == "length" and not content:
            # SGLang keeps a </think> emitted just before the cut; retokenized rows leave it out.
            expected_texts.append(reasoning + THINK_END)
        self.pending.append((n, line, output_ids, expected_texts))
        if len(self.pending) >= _DECODE_BATCH:
            self.flush()

    def _suffix(self, thinking: bool) -> list[int]:
        """The ids every generation prompt ends with, found as the common tail of two renders."""
        if thinking not in self.suffix:
            assert self.tokenizer is not None
            self.suffix[thinking] = self.tokenizer.generation_suffix(thinking)
        return self.suffix[thinking]

    def flush(self) -> None:
        if not self.pending or self.tokenizer is None:
            return
        texts = self.tokenizer.decode_batch([ids for _, _, ids, _ in self.pending])
        for (n, line, _, expected), text in zip(self.pending, texts, strict=True):
            self.report.decoded += 1
            if text not in expected:
                self.report.add(n, line, "decode_mismatch", _first_difference(text, expected[0]))
        self.pending.clear()


def _first_difference(got: str, want: str) -> str:
    k = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
    return (
        f"decoded text differs at character {k}: got {got[max(0, k - 12) : k + 12]!r}, "
        f"expected {want[max(0, k - 12) : k + 12]!r} (lengths {len(got)} vs {len(want)})"
    )


def verify_dataset(
    dataset: Dataset,
    tokenizer: TargetTokenizer | None = None,
    *,
    require_ids: bool = False,
    check_prompts: bool = False,
    journal: dict[str, float] | None = None,  # dollars per dataset (engine/run/recovery.py `journal_spend`)
    examples_per_rule: int = 5,
) -> DatasetReport:
    """Check ``dataset``'s rows against its prompts and docs/data-contract.md §4; nothing is written."""
    report = DatasetReport(dataset.name, dataset.folder, examples_per_rule=examples_per_rule)
    index = _index_prompts(dataset, with_offsets=check_prompts)
    report.prompts = len(index.hashes)
    report.invalid_prompts = index.invalid
    checker = _Checker(
        dataset, report, index, tokenizer, require_ids=require_ids, check_prompts=check_prompts
    )
    last_row = -1
    try:
        for n, row in _rows(dataset.results_path, report):
            checker.row(n, row)
            last_row = n
    finally:
        checker.close()
    report.tokenizer_hashes = len(checker.hashes_seen)
    report.tokenizer_checked = tokenizer is not None and checker.tokenizer_key in checker.hashes_seen
    if tokenizer is None and report.rows > report.not_tokenized:
        report.notes.append("no tokenizer given: id checks against the tokenizer were skipped")
    if not dataset.results_path.exists():
        report.notes.append(f"no {RESULTS_FILE} yet")
    # §4.10
    if journal is not None:
        spend = journal.get(dataset.name, 0.0)
        report.journal_spend = spend
        if report.cost > spend + 1e-9 * max(1.0, spend):
            report.add(
                last_row,
                None,
                "cost_exceeds_journal",
                f"rows cost ${report.cost:.6f}, the attempt journal ${spend:.6f}",
            )
    return report


def _rows(path: Path, report: DatasetReport) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        yield from iter_jsonl(path)
    except JsonlError as exc:
        # A corrupt complete line is a violation at that line; the rest of the file is unreadable.
        match = re.search(r"line (\d+)", str(exc))
        report.add(int(match.group(1)) if match else -1, None, "schema", str(exc))
