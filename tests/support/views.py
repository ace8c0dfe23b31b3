"""Partial views for tests of the code that reads them: a pane's line, a money line, a control
server's snapshot read only some keys of engine/schema.py's TypedDicts, and a test builds only those."""

from __future__ import annotations

from typing import Any, TypeVar, cast

from regen.engine.schema import AccountView, SGLangAccount

V = TypeVar("V")


def partial(kind: type[V], **keys: Any) -> V:
    """`keys` as a `kind` (a TypedDict of engine/schema.py) without its other keys: the code under test
    reads only these, and the test would fail with a KeyError if it read more."""
    return cast(V, keys)


def sglang_account(account: AccountView) -> SGLangAccount:
    """An SGLang lane's account (a lane's account is either kind; `kind` tells them apart)."""
    assert account["kind"] == "sglang", account["kind"]
    return account
