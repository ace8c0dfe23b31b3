"""What a resume needs from a row, read without parsing the whole row.

A resume needs, per row, its line, the prompt digest, the status, the completion tokens, the amount
and the backend (engine/run/recovery.py read_rows); the row's text (reasoning, content, ids) is most
of its bytes and none of that. regen writes every row in one key order, `FIELDS` (engine/data/row.py),
and this slicer is made from that order and from the row's types, so a key moved there moves here:

- a key followed by `":` cannot occur inside a JSON string (its quote would be escaped), only as a
  key; so from one key the next key of the order is found by searching for it, as long as no value
  on the way can nest (a string, a number, a list of ids: told by its type in `Row`);
- a value that can nest (`meta`, `native_finish_reason`, `usage`) is read with orjson up to the next
  key; a key of the same name nested inside it is told apart because the slice cut there is not
  valid JSON (a strict prefix of an object never is), and the next occurrence is tried.

So the slicer reads, in `FIELDS` order, the keys it wants and the keys that may nest, and jumps over
the rest. A row in any other shape (hand-written, another version) gives None and is parsed whole by
the caller, so this is a shortcut, never a second set of rules (BENCHMARKS.md "Restart").
"""

from __future__ import annotations

import re
from types import UnionType
from typing import Any, Literal, NamedTuple, TypedDict, Union, get_args, get_origin, get_type_hints

import orjson

from regen.engine.data.row import FIELDS, Row, Usage, row_problem

__all__ = ["SLICE_FROM", "WANTED", "RowFacts", "row_facts"]

# Rows at least this long are sliced, shorter ones parsed whole: orjson parses 1.3 KB (a row
# without token ids) in about 3 us, this takes about 5 us at any length; 4 KB (ids kept) 10 us against
# 6 (BENCHMARKS.md "Restart").
SLICE_FROM = 2048


class RowFacts(TypedDict):
    """The part of a `Row` a resume reads (a `Row` is one too)."""

    line: int
    prompt_sha256: str
    status: str
    backend: str
    usage: Usage
    cost: float | None


WANTED: tuple[str, ...] = tuple(RowFacts.__annotations__)


def _may_nest(kind: Any) -> bool:
    """Whether a value of this declared type can hold an object or a list of objects: anything but
    strings, numbers, booleans, null, literals and lists of those."""
    origin, args = get_origin(kind), get_args(kind)
    if kind in (str, int, float, bool, type(None)) or origin is Literal:
        return False
    if origin in (Union, UnionType, list):
        return any(_may_nest(arg) for arg in args)
    return True


# A JSON string, unrolled (runs of plain characters between escapes): the alternation per character
# costs 2 us on a row's head.
_STRING = rb'"[^"\\]*(?:\\.[^"\\]*)*"'
_NUMBER = rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_SCALARS: dict[Any, bytes] = {
    str: _STRING,
    int: rb"-?\d+",
    float: _NUMBER,
    bool: rb"true|false",
    type(None): b"null",
}


def _pattern(kind: Any) -> bytes:
    """A regular expression for a JSON value of a type that cannot nest."""
    origin, args = get_origin(kind), get_args(kind)
    if origin is Literal:
        return _STRING
    if origin in (Union, UnionType):
        return b"|".join(_pattern(arg) for arg in args)
    if origin is list:
        return rb"\[(?:" + _pattern(args[0]) + rb"|[,\s])*\]"
    return _SCALARS[kind]


def _marker(key: str) -> bytes:
    return b',"%s":' % key.encode()


class _Run(NamedTuple):
    """Keys whose values cannot nest, one after another: matched by one expression where one of
    them is wanted (its values captured), else jumped over to the key after them."""

    regex: re.Pattern[bytes] | None  # None: jumped
    names: tuple[str, ...]  # the wanted keys, in the expression's groups
    then: bytes  # the key after the run


class _Nested(NamedTuple):
    """A key whose value can nest, read up to the key after it."""

    key: str
    marker: bytes
    until: bytes
    wanted: bool


# A nested value's common shapes, read without trying slices, by its first byte: a flat object, a
# plain string (null is told by a comparison).
_SHAPES = {ord("{"): rb"\{[^{}]*\}", ord('"'): rb'"[^"\\]*"'}


def _plan() -> tuple[_Run | _Nested, ...]:
    """The steps from the row's first key to the last one wanted (`FIELDS` order, `Row`'s types)."""
    kinds = get_type_hints(Row)
    keys = FIELDS[: max(FIELDS.index(key) for key in WANTED) + 1]
    steps: list[_Run | _Nested] = []
    run: list[str] = []

    def close(after: str) -> None:
        if not run:
            return
        names = tuple(key for key in run if key in WANTED)
        regex = None
        if names:
            parts = [
                b'"%s":' % key.encode() + (b"(%s)" if key in WANTED else b"(?:%s)") % _pattern(kinds[key])
                for key in run
            ]
            lead = rb"\{" if run[0] == FIELDS[0] else b","
            regex = re.compile(lead + b",".join(parts) + b"(?=" + re.escape(_marker(after)) + b")")
        steps.append(_Run(regex, names, _marker(after)))
        run.clear()

    for i, key in enumerate(keys):
        after = FIELDS[i + 1]
        if _may_nest(kinds[key]):
            close(key)
            until = _marker(after)
            steps.append(_Nested(key, _marker(key), until, key in WANTED))
        else:
            run.append(key)
    close(FIELDS[len(keys)])
    return tuple(steps)


def _fast(
    plan: tuple[_Run | _Nested, ...],
) -> tuple[tuple[re.Pattern[bytes] | None, bytes, tuple[str, ...]], ...]:
    """The same steps as few expressions: each stretch between two jumps in one, a nested value in
    it taken in its common shapes only (null, a flat object, a plain string). Each item: the
    expression (None: a jump), the key jumped to, the wanted keys in the expression's groups."""
    out: list[tuple[re.Pattern[bytes] | None, bytes, tuple[str, ...]]] = []
    parts: list[bytes] = []
    names: list[str] = []
    ahead = b""  # the key after the last part: where the expression must end

    def close() -> None:
        if parts:
            out.append((re.compile(b"".join(parts) + b"(?=%s)" % re.escape(ahead)), b"", tuple(names)))
            parts.clear()
            names.clear()

    for step in plan:
        if isinstance(step, _Nested):
            shapes = b"null|" + b"|".join(_SHAPES.values())
            parts.append(re.escape(step.marker) + (b"(%s)" if step.wanted else b"(?:%s)") % shapes)
            names.extend([step.key] if step.wanted else [])
            ahead = step.until
        elif step.regex is None:
            close()
            out.append((None, step.then, ()))
        else:
            parts.append(step.regex.pattern.split(b"(?=")[0])
            names.extend(step.names)
            ahead = step.then
    close()
    return tuple(out)


_PLAN = _plan()
_FAST_PLAN = _fast(_PLAN)
_FAST = {
    step.until: {
        first: re.compile(b"%s(?=%s)" % (shape, re.escape(step.until))) for first, shape in _SHAPES.items()
    }
    for step in _PLAN
    if isinstance(step, _Nested)
}


def _value_until(raw: bytes, start: int, key: bytes) -> tuple[Any, int] | None:
    """The JSON value from `start` up to the first `key` after it at the same level, and where
    that key is."""
    if raw.startswith(b"null", start) and raw.startswith(key, start + 4):
        return None, start + 4
    shape = _FAST[key].get(raw[start])
    quick = None if shape is None else shape.match(raw, start)
    if quick is not None:
        return orjson.loads(quick.group()), quick.end()
    at = raw.find(key, start)
    while at != -1:
        try:
            return orjson.loads(raw[start:at]), at
        except orjson.JSONDecodeError:
            at = raw.find(key, at + 1)  # the key of a nested object: the slice was cut inside it
    return None


def row_facts(raw: bytes) -> RowFacts | None:
    """The row's line, prompt_sha256, status, backend, usage and cost, with the values a whole parse
    gives for them; None when the row is not in regen's key order or a fact is not as a row has it
    (the whole parse then names the problem)."""
    # NUL bytes are what a power loss leaves where a write never reached the disk: the whole parse
    # names the line; so does one that does not end its object.
    if not raw.endswith(b"}\n") or b"\x00" in raw:
        return None
    facts = _quickly(raw)
    if facts is None:
        facts = _carefully(raw)
    if facts is None or row_problem(facts) is not None:
        return None
    if facts["usage"] is None:
        facts["usage"] = {}  # an older row's: no counts, as read_row reads it
    return facts  # type: ignore[return-value]  # checked by row_problem as read_row checks a row


def _quickly(raw: bytes) -> dict[str, Any] | None:
    """The facts of a row whose nested values are in their common shapes, else None."""
    facts: dict[str, Any] = {}
    at = 0
    for regex, then, names in _FAST_PLAN:
        if regex is None:
            at = raw.find(then, at)  # no value on the way can hold the key: the first is it
            if at == -1:
                return None
            continue
        matched = regex.match(raw, at)
        if matched is None:
            return None
        for name, value in zip(names, matched.groups(), strict=True):
            facts[name] = orjson.loads(value)
        at = matched.end()
    return facts


def _carefully(raw: bytes) -> dict[str, Any] | None:
    """The facts of a row in regen's key order whatever its nested values hold, else None."""
    facts: dict[str, Any] = {}
    at = 0
    for step in _PLAN:
        if isinstance(step, _Nested):
            if not raw.startswith(step.marker, at):
                return None
            found = _value_until(raw, at + len(step.marker), step.until)
            if found is None:
                return None
            if step.wanted:
                facts[step.key] = found[0]
            at = found[1]
        elif step.regex is None:
            at = raw.find(step.then, at)  # no value on the way can hold the key: the first is it
            if at == -1:
                return None
        else:
            matched = step.regex.match(raw, at)
            if matched is None:
                return None
            for name, value in zip(step.names, matched.groups(), strict=True):
                facts[name] = orjson.loads(value)
            at = matched.end()
    return facts
