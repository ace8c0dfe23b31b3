"""What a resume needs from a row, read without parsing the whole row.

A resume needs, per row, its line, the prompt digest, the status, the completion tokens and the
backend (engine/run/recovery.py read_rows); the row's text (reasoning, content, ids) is most of its
bytes and none of that. regen writes every row in one key order (engine/job/rows.py build_row):

    {"schema_version":..,"id":..,"dataset":..,"line":N,"prompt_sha256":"..","source_id":..,
     "meta":..,"status":"..","backend":"..",<strings and id arrays>,"usage":{..},"cost":..,..}

so the fields are found by their keys, in that order, and only the small values that may nest are
handed to orjson (`meta` when it is not null, `usage`, `cost`). A key followed by `":` cannot occur
inside a JSON string (its quote would be escaped), only as a key; a key of the same name nested in
`meta` or `usage` is told apart because the slice cut there is not valid JSON (a strict prefix of an
object never is), and the next occurrence is tried. A row in any other shape (hand-written, another version) gives None and is
parsed whole by the caller, so this is a shortcut, never a second set of rules (BENCHMARKS.md "Restart").
"""

from __future__ import annotations

import re
from typing import Any

import orjson

# Rows at least this long are sliced, shorter ones parsed whole: orjson parses 1.3 KB (a row
# without token ids) in about 3 us, this takes about 5 us at any length; 4 KB (ids kept) 10 us against
# 6 (BENCHMARKS.md "Restart").
SLICE_FROM = 2048

# The head, up to the value of `meta`: regen's own values, strings without escapes but `source_id`.
_HEAD = re.compile(
    rb'\{"schema_version":\d+,"id":"[^"\\]*","dataset":"[^"\\]*","line":(\d+),"prompt_sha256":"([^"\\]*)",'
    rb'"source_id":(?:null|"(?:[^"\\]|\\.)*"),"meta":'
)
_NO_META = b'null,"status":"'
_STATUS = b',"status":"'
_STATUS_BACKEND = re.compile(rb'([^"\\]*)","backend":"([^"\\]*)"')
_USAGE = b',"usage":'
# `usage` as the backends write it (flat: a nested object is read by _value_until), then `cost`.
_USAGE_COST = re.compile(
    rb',"usage":(\{[^{}]*\}|null),"cost":(null|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?),"cost_estimated":'
)
_COST = b',"cost":'
_AFTER_COST = b',"cost_estimated":'


def _value_until(raw: bytes, start: int, key: bytes) -> tuple[Any, int] | None:
    """The JSON value from `start` up to the first `key` after it at the same level, and where
    that key is."""
    at = raw.find(key, start)
    while at != -1:
        try:
            return orjson.loads(raw[start:at]), at
        except orjson.JSONDecodeError:
            at = raw.find(key, at + 1)  # the key of a nested object: the slice was cut inside it
    return None


def row_facts(raw: bytes) -> dict[str, Any] | None:
    """The row's line, prompt_sha256, status, backend, usage and cost, with the values a whole
    parse gives for them; None when the row is not in regen's key order."""
    # NUL bytes are what a power loss leaves where a write never reached the disk: the whole parse
    # names the line; so does one that does not end its object.
    head = _HEAD.match(raw)
    if head is None or not raw.endswith(b"}\n") or b"\x00" in raw:
        return None
    at = head.end()
    if raw.startswith(_NO_META, at):
        at += len(_NO_META)
    else:
        meta = _value_until(raw, at, _STATUS)
        if meta is None:
            return None
        at = meta[1] + len(_STATUS)
    named = _STATUS_BACKEND.match(raw, at)
    if named is None:
        return None
    at = raw.find(_USAGE, named.end())
    if at == -1:
        return None
    tail = _USAGE_COST.match(raw, at)
    if tail is not None:
        usage, cost = orjson.loads(tail.group(1)), orjson.loads(tail.group(2))
    else:
        nested = _value_until(raw, at + len(_USAGE), _COST)
        if nested is None:
            return None
        usage, at = nested
        amount = _value_until(raw, at + len(_COST), _AFTER_COST)
        if amount is None:
            return None
        cost = amount[0]
    return {
        "line": int(head.group(1)),
        "prompt_sha256": head.group(2).decode(),
        "status": named.group(1).decode(),
        "backend": named.group(2).decode(),
        "usage": usage,
        "cost": cost,
    }
