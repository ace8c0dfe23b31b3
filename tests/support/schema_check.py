"""A strict check of a value against the snapshot's types (src/regen/engine/schema.py), at run time.

mypy checks that the job's code builds a `Snapshot`; this checks what it built, as the console will
read it: every required key there and no key the schema does not name, exact types (a str subclass
such as a backend's StrEnum member is not a str: orjson refuses it as a key, and a console would
compare it differently), no bool where a number goes, no NaN or infinity (they become null on the
wire), and `Any` (an event's own fields) only as JSON's own types.

Why not pydantic's TypeAdapter: on Python 3.11 it refuses `typing.TypedDict` (it asks for
typing_extensions'), and its strict mode still takes a str subclass for a str. Required keys are
read from the annotations' `Required`/`NotRequired` and the class's totality (schema.py's subclassed
TypedDicts share their base's totality), since `__required_keys__` cannot see those wrappers under
`from __future__ import annotations` before Python 3.12.
"""

from __future__ import annotations

import math
import types
import typing
from functools import cache
from typing import Any, Literal, NotRequired, Required, Union, get_args, get_origin


def problems(value: Any, expected: Any, path: str = "") -> list[str]:
    """Every place where `value` is not what `expected` (a type from schema.py) says, as
    `lanes[0].errors.abort: a key of type ErrorClass, not str`; empty when it is."""
    found: list[str] = []
    _check(value, expected, path, found)
    return found


def _at(path: str) -> str:
    return path or "(the value)"


def _check(value: Any, expected: Any, path: str, found: list[str]) -> None:
    origin = get_origin(expected)
    if expected is Any:
        _check_json(value, path, found)
    elif expected is None or expected is type(None):
        if value is not None:
            found.append(f"{_at(path)}: {type(value).__name__} {value!r:.60}, expected None")
    elif origin is Union or origin is types.UnionType:
        branches = get_args(expected)
        results: list[list[str]] = [problems(value, branch, path) for branch in branches]
        if all(results):
            # The branch with the fewest problems says most about what went wrong.
            fewest: list[str] = min(results, key=len)
            found.extend(fewest)
    elif origin is Literal:
        if not any(type(value) is type(option) and value == option for option in get_args(expected)):
            found.append(f"{_at(path)}: {value!r:.60}, expected one of {get_args(expected)}")
    elif typing.is_typeddict(expected):
        _check_typeddict(value, expected, path, found)
    elif origin is list:
        if type(value) is not list:
            found.append(f"{_at(path)}: {type(value).__name__}, expected a list")
            return
        (item,) = get_args(expected)
        for index, element in enumerate(value):
            _check(element, item, f"{path}[{index}]", found)
    elif origin is dict:
        if type(value) is not dict:
            found.append(f"{_at(path)}: {type(value).__name__}, expected a dict")
            return
        key_type, item = get_args(expected)
        for key, element in value.items():
            here = f"{path}.{key}" if path else str(key)
            if type(key) is not key_type:
                found.append(f"{here}: a key of type {type(key).__name__}, not {key_type.__name__}")
            _check(element, item, here, found)
    elif expected is float:
        if type(value) not in (float, int):
            found.append(f"{_at(path)}: {type(value).__name__} {value!r:.60}, expected a number")
        elif not math.isfinite(value):
            found.append(f"{_at(path)}: {value}, which the wire turns into null")
    elif expected in (str, int, bool):
        if type(value) is not expected:
            found.append(f"{_at(path)}: {type(value).__name__} {value!r:.60}, expected {expected.__name__}")
    else:
        raise TypeError(f"{_at(path)}: the checker does not know {expected!r}")


def _check_typeddict(value: Any, expected: Any, path: str, found: list[str]) -> None:
    if type(value) is not dict:
        found.append(f"{_at(path)}: {type(value).__name__}, expected {expected.__name__}")
        return
    fields, required = _fields(expected)
    for key in value:
        if key not in fields:
            found.append(f"{path}.{key}: not a key of {expected.__name__}" if path else f"{key}: not a key")
    for key, hint in fields.items():
        here = f"{path}.{key}" if path else key
        if key not in value:
            if key in required:
                found.append(f"{here}: missing (required by {expected.__name__})")
            continue
        _check(value[key], hint, here, found)


@cache
def _fields(expected: Any) -> tuple[dict[str, Any], frozenset[str]]:
    """A TypedDict's keys with their types (the Required/NotRequired wrappers taken off), and which
    of them are required."""
    hints = typing.get_type_hints(expected, include_extras=True)
    fields: dict[str, Any] = {}
    required: set[str] = set()
    for key, hint in hints.items():
        origin = get_origin(hint)
        if origin is Required or origin is NotRequired:
            (inner,) = get_args(hint)
            fields[key] = inner
            if origin is Required:
                required.add(key)
        else:
            fields[key] = hint
            if expected.__total__:
                required.add(key)
    return fields, frozenset(required)


def json_problems(value: Any, path: str = "") -> list[str]:
    """Every place where `value` is not made of JSON's own types exactly (a journal's record, an
    event): a str subclass, a Decimal, a tuple, a NaN."""
    found: list[str] = []
    _check_json(value, path, found)
    return found


def _check_json(value: Any, path: str, found: list[str]) -> None:
    """`Any` in the schema (an event's own fields): JSON's own types, exactly."""
    if value is None or type(value) in (str, bool, int):
        return
    if type(value) is float:
        if not math.isfinite(value):
            found.append(f"{_at(path)}: {value}, which the wire turns into null")
    elif type(value) is list:
        for index, element in enumerate(value):
            _check_json(element, f"{path}[{index}]", found)
    elif type(value) is dict:
        for key, element in value.items():
            here = f"{path}.{key}" if path else str(key)
            if type(key) is not str:
                found.append(f"{here}: a key of type {type(key).__name__}, not str")
            _check_json(element, here, found)
    else:
        found.append(f"{_at(path)}: {type(value).__name__} {value!r:.60}, not a JSON type")
