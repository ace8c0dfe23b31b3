"""Datasets of chat prompts: discovery, line validation, streaming scans.

A dataset is a folder holding ``prompts.jsonl``; its name is the folder name. One JSON object per
line in OpenAI chat format (docs/data-contract.md §1). A prompt's identity is ``(dataset, line)`` with a
0-based line number, guarded by the sha256 of its canonical messages (docs/data-contract.md §2). Line
numbers are 0-based everywhere regen shows them, so ``B3 line 1234`` is the prompt ``B3-00001234``.

Files can hold millions of lines, so nothing here keeps a whole file in memory: ``scan`` and
``iter_prompts`` read fixed-size chunks and split lines at ``\\n`` bytes.

The module depends on the standard library only (orjson is used when importable), so it can be
copied to the GPU host and run there as ``python3 datasets.py DIR...`` to validate every line where
the data lives.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
from array import array
from collections.abc import Collection, Container, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - exercised only on hosts without orjson
    orjson = None  # type: ignore[assignment]

__all__ = [
    "MAX_LINE_BYTES",
    "MAX_NESTING",
    "PROMPTS_FILE",
    "RESULTS_FILE",
    "ROLES",
    "Dataset",
    "DatasetError",
    "InvalidLine",
    "Prompt",
    "ScanReport",
    "canonical_json",
    "canonical_sha256",
    "check_line",
    "discover",
    "iter_prompts",
    "name_problem",
    "read_lines",
    "reason_kind",
    "scan",
    "validate_line",
]

PROMPTS_FILE = "prompts.jsonl"
RESULTS_FILE = "raw_responses.jsonl"
ROLES = frozenset({"system", "user", "assistant", "tool"})

# Big enough that the per-chunk Python overhead vanishes, small enough to stay cache friendly.
_CHUNK = 1 << 20
# The longest prompt line read (docs/inputs.md). A whole Kimi K2.5 context (256k tokens) is about
# 1 MiB of text; a longer line is reported invalid without ever being held whole in memory.
MAX_LINE_BYTES = 16 << 20
_BOM = b"\xef\xbb\xbf"
# '#' separates the prompt id from the attempt number in request ids (docs/data-contract.md §2).
_BAD_NAME = re.compile(r"[\s#\x00-\x1f\x7f]")


class DatasetError(ValueError):
    """A dataset cannot be used as given; the message is one line and names the path."""


# ---------------------------------------------------------------------------------------------
# Datasets and discovery


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    folder: Path

    @property
    def prompts_path(self) -> Path:
        return self.folder / PROMPTS_FILE

    @property
    def results_path(self) -> Path:
        return self.folder / RESULTS_FILE


def _dataset_at(folder: Path) -> Dataset:
    if not folder.exists():
        raise DatasetError(f"{folder}: dataset folder does not exist")
    if not folder.is_dir():
        raise DatasetError(f"{folder}: not a folder (a dataset is a folder holding {PROMPTS_FILE})")
    if not (folder / PROMPTS_FILE).is_file():
        raise DatasetError(f"{folder}: no {PROMPTS_FILE} in this folder")
    # Path(".").name is empty; the dataset is still named after the folder it really is.
    name = folder.name or folder.resolve().name
    problem = name_problem(name)
    if problem is not None:
        raise DatasetError(f"{folder}: {problem}")
    return Dataset(name=name, folder=folder)


def name_problem(name: str) -> str | None:
    """Why a folder name cannot name a dataset (request ids are built from it), or None."""
    if not name or name.startswith(".") or _BAD_NAME.search(name):
        return f"dataset name {name!r} is not usable (no whitespace, control characters, '#' or leading '.')"
    return None


def discover(
    folders: Sequence[Path],
    roots: Sequence[Path],
    only: Collection[str] | None = None,
) -> list[Dataset]:
    """Datasets named directly (``folders``, in order) then found under ``roots``.

    Each root contributes its immediate subfolders that hold a ``prompts.jsonl``, sorted by name.
    ``only`` keeps just the named datasets; naming one that was not found is an error, as is a
    root with no datasets at all (almost always a wrong path) or two different folders with the
    same name (results would be keyed ambiguously).
    """
    found: list[Dataset] = []
    for folder in folders:
        found.append(_dataset_at(Path(folder)))
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            what = "does not exist" if not root.exists() else "is not a folder"
            raise DatasetError(f"{root}: datasets root {what}")
        subs = sorted(
            (
                p
                for p in root.iterdir()
                if p.is_dir() and not p.name.startswith(".") and (p / PROMPTS_FILE).is_file()
            ),
            key=lambda p: p.name,
        )
        if not subs:
            raise DatasetError(f"{root}: no dataset folders (subfolders holding {PROMPTS_FILE})")
        found.extend(_dataset_at(p) for p in subs)

    by_name: dict[str, Dataset] = {}
    result: list[Dataset] = []
    for ds in found:
        seen = by_name.get(ds.name)
        if seen is None:
            by_name[ds.name] = ds
            result.append(ds)
        elif seen.folder.resolve() != ds.folder.resolve():
            raise DatasetError(f"{ds.folder}: dataset name {ds.name!r} is also used by {seen.folder}")
        # The same folder reached twice (named and under a root) is one dataset.

    if only is not None:
        wanted = set(only)
        unknown = sorted(wanted - by_name.keys())
        if unknown:
            known = ", ".join(sorted(by_name)) or "none"
            raise DatasetError(f"unknown dataset {', '.join(unknown)} (found: {known})")
        result = [ds for ds in result if ds.name in wanted]
    return result


# ---------------------------------------------------------------------------------------------
# Prompts and canonical hashing


@dataclass(slots=True)
class Prompt:
    dataset: str
    line: int
    sha256: str
    messages: list[dict[str, Any]]
    source_id: str | None = None
    meta: dict[str, Any] | None = None

    @property
    def id(self) -> str:
        return f"{self.dataset}-{self.line:08d}"

    @property
    def request_messages(self) -> list[dict[str, Any]]:
        """The messages exactly as the line holds them; this is what goes to the backend, so
        ``sha256`` always describes what was sent."""
        return self.messages


def canonical_json(messages: Any) -> bytes:
    """The canonical bytes of docs/data-contract.md §2, by its defining ``json.dumps`` call."""
    return json.dumps(messages, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")


def canonical_sha256(messages: Any) -> str:
    """Hex sha256 of the canonical messages (docs/data-contract.md §2); the reference definition."""
    return hashlib.sha256(canonical_json(messages)).hexdigest()


def _all_string_values(messages: list[dict[str, Any]]) -> bool:
    for m in messages:
        for v in m.values():
            if type(v) is not str:
                return False
    return True


# Integers beyond 64 bits come out of orjson as floats of at least this size.
_ORJSON_INT_LIMIT = float(2**63)


def _holds_huge_float(value: Any) -> bool:
    # A loop, not recursion: meta may be nested as deep as orjson reads (1024 levels), deeper
    # than Python's own recursion limit.
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is float:
            if abs(item) >= _ORJSON_INT_LIMIT:
                return True
        elif kind is dict:
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
    return False


# ---------------------------------------------------------------------------------------------
# Line validation


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _OutOfRange(ValueError):
    """A number JSON can write but no float holds (1e999)."""


def _strict_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _OutOfRange("number out of range")
    return value


def _strict_json_loads(raw: bytes | str) -> Any:
    return json.loads(raw, parse_constant=_reject_constant, parse_float=_strict_float)


def _unreadable(exc: BaseException, raw: bytes | str) -> str:
    """Why the reference parser refused a line, in the words docs/inputs.md lists."""
    if isinstance(exc, RecursionError):
        return _TOO_DEEP
    if isinstance(exc, _OutOfRange):
        return "a number is out of range"
    if "integer string conversion" in str(exc):
        return "a number has too many digits"
    if ("\x00" in raw) if isinstance(raw, str) else (b"\x00" in raw):
        return "holds a NUL byte"
    return "not valid JSON"


@dataclass(slots=True)
class _Valid:
    obj: dict[str, Any]
    messages: list[dict[str, Any]]
    canonical: bytes
    content_chars: int


_MESSAGE_N = re.compile(r"^message \d+: ")
_QUOTED = re.compile(r"'[^']*'")


def reason_kind(reason: str) -> str:
    """The error kind of a reason, for grouping: ``message 2: role 'bot' not allowed`` becomes
    ``message N: role not allowed``."""
    kind = _MESSAGE_N.sub("message N: ", reason)
    return re.sub(r"\s+", " ", _QUOTED.sub("", kind)).strip()


def _parse(raw: bytes) -> tuple[Any, bool]:
    """``(document, exact)``, or ``(_Reason, False)`` when the line is not JSON at all.

    ``exact`` is true when the reference parser (``json.loads``) read the line, so numbers are
    exactly what it would make of them; orjson reads integers past 64 bits as floats.
    """
    if orjson is not None:
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # classify below; some of what orjson refuses is still valid JSON
        else:
            return (_Reason(_TOO_DEEP), False) if _too_deep(raw, doc) else (doc, False)
    if not raw.strip():
        return _Reason("blank line"), False
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return _Reason("not valid UTF-8"), False
    if text.startswith("\ufeff"):
        return _Reason("starts with a UTF-8 byte order mark"), False
    try:
        # Lone surrogate escapes are valid JSON that orjson refuses; the reference parser reads
        # them, so the line is judged on what it says.
        doc = _strict_json_loads(text)
    except (ValueError, RecursionError) as exc:
        return _Reason(_unreadable(exc, text)), False
    return (_Reason(_TOO_DEEP), False) if _too_deep(raw, doc) else (doc, True)


# Deepest nesting a line may have (docs/inputs.md). Fixed, so the verdict does not depend on how
# deep the caller's stack is: the reference parser recurses once per level up to Python's
# recursion limit (1000), orjson stops at 1024; below 512 both always read a line.
MAX_NESTING = 512
_TOO_DEEP = "JSON nested too deep"


def _too_deep(raw: bytes, doc: Any) -> bool:
    # Two C-speed counts bound the depth; only a line with that many brackets is walked.
    if raw.count(b"[") + raw.count(b"{") <= MAX_NESTING:
        return False
    stack = [(doc, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_NESTING:
            return True
        if type(item) is dict:
            stack.extend((v, depth + 1) for v in item.values() if type(v) in (dict, list))
        elif type(item) is list:
            stack.extend((v, depth + 1) for v in item if type(v) in (dict, list))
    return False


class _Reason(str):
    """Marks a parse failure apart from a JSON document that is itself a string."""

    __slots__ = ()


def _check(raw: bytes) -> _Valid | str:
    if raw is _OVERLONG:
        return f"line longer than {MAX_LINE_BYTES} bytes"
    obj, exact = _parse(raw)
    if type(obj) is _Reason:
        return str(obj)
    if not isinstance(obj, dict):
        return "not a JSON object"
    messages = obj.get("messages")
    if messages is None or messages == []:
        return "messages missing or empty"
    if not isinstance(messages, list):
        return "messages is not a list"
    chars = 0
    last = len(messages)
    for n, m in enumerate(messages, 1):
        if not isinstance(m, dict):
            return f"message {n}: not an object"
        role = m.get("role")
        if role is None:
            return f"message {n}: role missing"
        if not isinstance(role, str):
            return f"message {n}: role is not a string"
        if role not in ROLES:
            return f"message {n}: role {_short(role)} not allowed"
        if role == "system" and n != 1:
            return "system message not first"
        content = m.get("content")
        if not isinstance(content, str):
            if isinstance(content, list):
                return f"message {n}: content is a list of parts (multimodal)"
            if content is None:
                return f"message {n}: content missing"
            return f"message {n}: content is not a string"
        chars += len(content)
        if n == last and role != "user":
            return "last message is not from the user"
    source_id = obj.get("id")
    if source_id is not None and not isinstance(source_id, str):
        return "id is not a string"
    meta = obj.get("meta")
    if meta is not None and not isinstance(meta, dict):
        return "meta is not an object"
    try:
        if not exact and _all_string_values(messages) and not (meta and _holds_huge_float(meta)):
            # orjson with sorted keys writes the same bytes as the json.dumps definition when
            # every message value is a string: it escapes exactly the same characters (proved
            # over every code point in tests/test_datasets.py) and sorts keys by code point, as
            # Python does. Numbers are where the two differ (1e-7 against 1e-07, and integers
            # past 64 bits read as floats), so those lines go the reference way.
            canonical = orjson.dumps(messages, option=orjson.OPT_SORT_KEYS)
        else:
            if not exact:
                obj = _strict_json_loads(raw)
                messages = obj["messages"]
            canonical = canonical_json(messages)
    except UnicodeEncodeError:
        # json.loads accepts "\ud800"; such a string has no UTF-8 form, so no canonical hash.
        return "a string holds an unpaired surrogate escape"
    except (ValueError, RecursionError) as exc:
        # orjson took it but the reference parser does not: judge by the reference.
        return _unreadable(exc, raw)
    return _Valid(obj, messages, canonical, chars)


def _short(value: str, limit: int = 24) -> str:
    # Reasons stay one short line even when a role field holds a paragraph.
    text = value if len(value) <= limit else value[: limit - 1] + "…"
    return "'" + text.replace("'", "’").replace("\n", " ") + "'"


def validate_line(raw: bytes, dataset: str = "", line: int = 0) -> Prompt | str:
    """A ``Prompt`` for a valid line, else the reason it is invalid (a short, stable phrase).

    ``raw`` may keep its trailing newline. ``dataset`` and ``line`` only label the prompt.
    """
    checked = _check(raw)
    if isinstance(checked, str):
        return checked
    return _prompt(checked, dataset, line)


def _prompt(v: _Valid, dataset: str, line: int) -> Prompt:
    return Prompt(
        dataset=dataset,
        line=line,
        sha256=hashlib.sha256(v.canonical).hexdigest(),
        messages=v.messages,
        source_id=v.obj.get("id"),
        meta=v.obj.get("meta"),
    )


# ---------------------------------------------------------------------------------------------
# Streaming


def _open(path: Path) -> Any:
    # Opened eagerly, so a missing file fails where the caller asked, not at first iteration.
    try:
        return open(path, "rb", buffering=0)  # _lines closes it
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot read ({e.strerror or e})") from None


class _Tap:
    """Sees every chunk read: the file's sha256, size and last byte come free with the scan."""

    __slots__ = ("hash", "last", "size")

    def __init__(self) -> None:
        self.hash = hashlib.sha256()
        self.size = 0
        self.last = b""

    def update(self, chunk: bytes) -> None:
        self.hash.update(chunk)
        self.size += len(chunk)
        self.last = chunk[-1:]


class _Overlong(bytes):
    """Stands for a line longer than MAX_LINE_BYTES, which is never held."""

    __slots__ = ()


_OVERLONG = _Overlong()


def _lines(f: Any, path: Path, tap: _Tap | None = None) -> Iterator[bytes]:
    """Every line of the file without its ``\\n``; a last line with no newline still counts.

    Reads fixed-size chunks so memory stays flat whatever the file size. A line longer than
    ``MAX_LINE_BYTES`` comes out as ``_OVERLONG`` (its bytes are skipped as they are read, so it
    costs one chunk of memory, not its length). Closes ``f``.
    """
    limit = MAX_LINE_BYTES
    with f:
        # The start of a line that spans chunks, gathered in one growing buffer (joining the
        # pieces pairwise would copy a long line once per chunk).
        pending = bytearray()
        skipping = False  # inside a line already known to be too long
        while True:
            try:
                chunk = f.read(_CHUNK)
            except OSError as e:
                raise DatasetError(f"{path}: read failed ({e.strerror or e})") from None
            if not chunk:
                break
            if tap is not None:
                tap.update(chunk)
            start = 0
            if pending or skipping:
                nl = chunk.find(b"\n")
                if nl < 0:
                    if not skipping and len(pending) + len(chunk) > limit:
                        skipping = True
                        pending = bytearray()
                    elif not skipping:
                        pending += chunk
                    continue
                if skipping or len(pending) + nl > limit:
                    yield _OVERLONG
                else:
                    pending += chunk[:nl]
                    yield bytes(pending)
                skipping = False
                pending = bytearray()
                start = nl + 1
            parts = (chunk[start:] if start else chunk).split(b"\n")
            tail = parts.pop()
            if limit >= _CHUNK:
                yield from parts  # a part of one chunk cannot be too long
            else:
                for part in parts:
                    yield part if len(part) <= limit else _OVERLONG
            if len(tail) > limit:
                skipping = True
            elif tail:
                pending += tail
        if skipping:
            yield _OVERLONG
        elif pending:
            yield bytes(pending)


# The two steps of a scan, for the bounded survey that runs on GPU hosts
# (engine/host/scripts/survey.py): the same reader and the same rules, whatever reads the result.
check_line = _check
read_lines = _lines


@dataclass(frozen=True, slots=True)
class InvalidLine:
    dataset: str
    line: int
    reason: str

    @property
    def kind(self) -> str:
        return reason_kind(self.reason)

    def __str__(self) -> str:
        return f"{self.dataset} line {self.line}: {self.reason}"


@dataclass(slots=True)
class ScanReport:
    """One pass over a dataset file: what ``regen inspect`` prints and what a run checks first."""

    dataset: str
    path: Path
    lines: int = 0
    valid: int = 0
    invalid: list[InvalidLine] = field(default_factory=list)
    # Lines whose canonical messages hash was already seen earlier in the file.
    duplicates: int = 0
    size: int = 0
    sha256: str = ""
    ends_with_newline: bool = True
    # Number of messages per valid prompt -> how many prompts have that many.
    turns: dict[int, int] = field(default_factory=dict)
    # Top-level keys other than messages/id/meta -> how many lines carry them (ignored keys).
    extra_keys: dict[str, int] = field(default_factory=dict)
    # Total content characters of each valid prompt, in line order; array keeps it 8 bytes each.
    content_chars: array[int] = field(default_factory=lambda: array("q"))
    # With scan(keep_digests=True): the first DIGEST_BYTES of each line's canonical-messages sha256,
    # line after line (zeros for an invalid line), so rows can be checked against their prompts
    # without reading the file again.
    digests: bytearray | None = None

    def digest_of(self, line: int) -> bytes | None:
        """The kept digest prefix of a valid line, or None."""
        if self.digests is None or not 0 <= line < self.lines:
            return None
        digest = bytes(self.digests[line * DIGEST_BYTES : (line + 1) * DIGEST_BYTES])
        return None if digest == _NO_DIGEST else digest

    @property
    def total(self) -> int:
        """Same as ``lines``: every line of the file, valid or not."""
        return self.lines

    @property
    def invalid_lines(self) -> frozenset[int]:
        """The invalid line numbers, ready for ``iter_prompts(skip_lines=...)``."""
        return frozenset(i.line for i in self.invalid)

    def invalid_by_kind(self, first: int = 5) -> dict[str, tuple[int, list[int]]]:
        """``kind -> (count, first few line numbers)``, kinds in order of first appearance."""
        out: dict[str, tuple[int, list[int]]] = {}
        for inv in self.invalid:
            count, sample = out.get(inv.kind, (0, []))
            if len(sample) < first:
                sample.append(inv.line)
            out[inv.kind] = (count + 1, sample)
        return out

    def content_chars_percentiles(self, ps: Sequence[int] = (50, 90, 99)) -> dict[str, int]:
        values = sorted(self.content_chars)
        if not values:
            return {f"p{p}": 0 for p in ps}
        # Nearest-rank: always a value that occurs, which reads better for lengths.
        return {
            f"p{p}": values[min(len(values) - 1, max(0, math.ceil(p / 100 * len(values)) - 1))] for p in ps
        }

    def to_dict(self, first: int = 5) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "path": str(self.path),
            "lines": self.lines,
            "valid": self.valid,
            "invalid": len(self.invalid),
            "invalid_by_kind": {
                k: {"count": c, "first_lines": s} for k, (c, s) in self.invalid_by_kind(first).items()
            },
            "duplicates": self.duplicates,
            "size": self.size,
            "sha256": self.sha256,
            "ends_with_newline": self.ends_with_newline,
            "turns": {str(k): v for k, v in sorted(self.turns.items())},
            "content_chars": self.content_chars_percentiles(),
            "extra_keys": dict(sorted(self.extra_keys.items())),
        }


_KNOWN_KEYS = frozenset({"messages", "id", "meta"})
# 16 bytes of a sha256 tell prompts apart with a collision chance far below anything observable.
DIGEST_BYTES = 16
_NO_DIGEST = bytes(DIGEST_BYTES)


def scan(dataset: Dataset, *, keep_digests: bool = False) -> ScanReport:
    """Validate every line of ``dataset`` in one streaming pass."""
    path = dataset.prompts_path
    report = ScanReport(dataset=dataset.name, path=path)
    tap = _Tap()
    lines = _lines(_open(path), path, tap)
    seen: set[bytes] = set()
    turns = report.turns
    extra = report.extra_keys
    invalid = report.invalid
    content_chars = report.content_chars
    sha256 = hashlib.sha256
    name = dataset.name
    digests = report.digests = bytearray() if keep_digests else None
    line = -1
    for line, raw in enumerate(lines):
        checked = _check(raw)
        if isinstance(checked, str):
            invalid.append(InvalidLine(name, line, checked))
            if digests is not None:
                digests += _NO_DIGEST
            continue
        # A digest prefix keeps the duplicate set small for multi-million-line files.
        digest = sha256(checked.canonical).digest()[:DIGEST_BYTES]
        if digests is not None:
            digests += digest
        if digest in seen:
            report.duplicates += 1
        else:
            seen.add(digest)
        n = len(checked.messages)
        turns[n] = turns.get(n, 0) + 1
        content_chars.append(checked.content_chars)
        if len(checked.obj) > 1:
            for key in checked.obj.keys() - _KNOWN_KEYS:
                extra[key] = extra.get(key, 0) + 1
    report.lines = line + 1
    report.valid = report.lines - len(invalid)
    report.sha256 = tap.hash.hexdigest()
    report.size = tap.size
    report.ends_with_newline = tap.size == 0 or tap.last == b"\n"
    return report


def iter_prompts(dataset: Dataset, skip_lines: Container[int] = ()) -> Iterator[Prompt]:
    """Valid prompts of ``dataset`` in line order, read lazily from disk.

    Invalid lines and ``skip_lines`` are passed over; line numbers match ``scan``.
    """
    path = dataset.prompts_path
    return _iter_prompts(dataset.name, _lines(_open(path), path), skip_lines)


def _iter_prompts(name: str, lines: Iterator[bytes], skip_lines: Container[int]) -> Iterator[Prompt]:
    for line, raw in enumerate(lines):
        if line in skip_lines:
            continue
        checked = _check(raw)
        if isinstance(checked, str):
            continue
        yield _prompt(checked, name, line)


# ---------------------------------------------------------------------------------------------
# Standalone use on the GPU host: python3 datasets.py DIR... (a dataset folder or a root of them)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: datasets.py DIR...  (dataset folders or folders of them; prints JSON lines)")
        return 2
    folders = [Path(a) for a in args if (Path(a) / PROMPTS_FILE).is_file()]
    roots = [Path(a) for a in args if not (Path(a) / PROMPTS_FILE).is_file()]
    try:
        datasets = discover(folders, roots)
        for ds in datasets:
            print(json.dumps(scan(ds).to_dict(), ensure_ascii=False), flush=True)
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
