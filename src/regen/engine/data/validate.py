"""A prompt line's rules (docs/data-contract.md §1): valid, or the short reason it is not.

``check_line`` is the one judge of a line, for the job's checks (data/scan.py) and the survey on the
GPU host (engine/host/scripts/survey.py) alike; a valid line's canonical bytes (§2) come with it.
Standard library only, orjson when importable, as data/datasets.py says. What is refused and why is
listed in docs/inputs.md; the limits are ``MAX_NESTING`` here and ``MAX_LINE_BYTES`` (data/lines.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from regen.engine.data.datasets import Prompt, canonical_json
from regen.engine.data.lines import MAX_LINE_BYTES, OVERLONG

try:
    import orjson
except ImportError:  # pragma: no cover - exercised only on hosts without orjson
    orjson = None  # type: ignore[assignment]

__all__ = ["MAX_NESTING", "ROLES", "ValidLine", "check_line", "reason_kind", "validate_line"]

ROLES = frozenset({"system", "user", "assistant", "tool"})


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
class ValidLine:
    """A line that keeps every rule: its object, its messages, their canonical bytes (§2), and the
    characters of content they hold."""

    obj: dict[str, Any]
    messages: list[dict[str, Any]]
    canonical: bytes
    content_chars: int

    def prompt(self, dataset: str, line: int) -> Prompt:
        return Prompt(
            dataset=dataset,
            line=line,
            sha256=hashlib.sha256(self.canonical).hexdigest(),
            messages=self.messages,
            source_id=self.obj.get("id"),
            meta=self.obj.get("meta"),
        )


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


def check_line(raw: bytes) -> ValidLine | str:
    if raw is OVERLONG:
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
            # over every code point in tests/engine/data/test_datasets.py) and sorts keys by code point, as
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
    return ValidLine(obj, messages, canonical, chars)


def _short(value: str, limit: int = 24) -> str:
    # Reasons stay one short line even when a role field holds a paragraph.
    text = value if len(value) <= limit else value[: limit - 1] + "…"
    return "'" + text.replace("'", "’").replace("\n", " ") + "'"


def validate_line(raw: bytes, dataset: str = "", line: int = 0) -> Prompt | str:
    """A ``Prompt`` for a valid line, else the reason it is invalid (a short, stable phrase).

    ``raw`` may keep its trailing newline. ``dataset`` and ``line`` only label the prompt.
    """
    checked = check_line(raw)
    if isinstance(checked, str):
        return checked
    return checked.prompt(dataset, line)
