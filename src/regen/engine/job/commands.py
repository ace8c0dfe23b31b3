"""Operator commands: one table of name -> handler, for every client (console, `regen stop`, headless).

A handler returns the text shown to the operator, or raises JobError with the refusal. `origin`
names who asked ("console", "operator", "guard"); it is journaled with the event. In a job with
several backends, `pause`, `resume`, `concurrency`, `exclude` and `include` take an optional
`backend` argument naming one lane (engine/job/lanes.py); without it they act on the whole job (pause,
resume, concurrency) or on the lane whose routes can be excluded. `deadline` sets or clears the job's
deadline (docs/fleets.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol

from regen.engine.run.state import JobError


class Steerable(Protocol):
    """The job as commands see it."""

    def pause(self, origin: str, backend: str | None = None) -> None: ...
    def resume(self, origin: str, backend: str | None = None) -> None: ...
    def exclude(self, name: str, *, origin: str, backend: str | None = None) -> str: ...
    def include(self, name: str, *, origin: str, backend: str | None = None) -> str: ...
    def set_concurrency(self, value: int, origin: str, backend: str | None = None) -> int: ...
    def set_budget(self, amount: Decimal, origin: str) -> str: ...
    def set_deadline(self, text: str | None, origin: str) -> str: ...
    def request_stop(self, *, cancel: bool, origin: str) -> str: ...
    def inspect_hosts(self, host: str | None, origin: str) -> str: ...
    def sglang_hosts(self, action: str, host: str | None, origin: str) -> str: ...


Handler = Callable[[Steerable, Mapping[str, Any], str], str]


def _backend(args: Mapping[str, Any]) -> str | None:
    """The lane a command names, if any."""
    name = args.get("backend")
    return str(name) if name else None


def _pause(job: Steerable, args: Mapping[str, Any], origin: str) -> str:
    backend = _backend(args)
    job.pause(origin, backend)
    if backend is not None:
        return f"paused {backend}: no new requests there; those in flight finish, the other backends go on"
    return "paused: no new requests; those in flight finish"


def _resume(job: Steerable, args: Mapping[str, Any], origin: str) -> str:
    backend = _backend(args)
    job.resume(origin, backend)
    return "resumed" if backend is None else f"resumed {backend}"


def _route(args: Mapping[str, Any], command: str) -> str:
    name = str(args.get("provider") or "")
    if not name:
        raise JobError(f"{command} needs a provider")
    return name


def _exclude(job: Steerable, args: Mapping[str, Any], origin: str) -> str:
    return job.exclude(_route(args, "exclude"), origin=origin, backend=_backend(args))


def _include(job: Steerable, args: Mapping[str, Any], origin: str) -> str:
    return job.include(_route(args, "include"), origin=origin, backend=_backend(args))


def _number(args: Mapping[str, Any], command: str) -> Decimal:
    try:
        value = Decimal(str(args["value"]))
    except (KeyError, InvalidOperation):
        raise JobError(f"{command} needs a number (value)") from None
    if not value.is_finite():
        raise JobError(f"{command} needs a finite number")
    return value


def _concurrency(job: Steerable, args: Mapping[str, Any], origin: str) -> str:
    backend = _backend(args)
    applied = job.set_concurrency(int(_number(args, "concurrency")), origin, backend)
    return f"concurrency {applied}" if backend is None else f"{backend} concurrency {applied}"


def _budget(job: Steerable, args: Mapping[str, Any], origin: str) -> str:
    return job.set_budget(_number(args, "budget"), origin)


def _deadline(job: Steerable, args: Mapping[str, Any], origin: str) -> str:
    # "12h", "06:30" (docs/fleets.md, "The deadline"); empty or "none" takes the deadline away.
    text = str(args.get("value") or "").strip()
    return job.set_deadline(None if text.lower() in ("", "none") else text, origin)


def _stop(job: Steerable, args: Mapping[str, Any], origin: str) -> str:
    return job.request_stop(cancel=bool(args.get("cancel")), origin=origin)


def _inspect(job: Steerable, args: Mapping[str, Any], origin: str) -> str:
    host = args.get("host")
    return job.inspect_hosts(str(host) if host else None, origin)


def _sglang(action: str) -> Handler:
    def handler(job: Steerable, args: Mapping[str, Any], origin: str) -> str:
        host = args.get("host")
        return job.sglang_hosts(action, str(host) if host else None, origin)

    return handler


COMMANDS: dict[str, Handler] = {
    "pause": _pause,
    "resume": _resume,
    "exclude": _exclude,
    "include": _include,
    "concurrency": _concurrency,
    "budget": _budget,
    "deadline": _deadline,
    "stop": _stop,
    "inspect": _inspect,
    "sglang_start": _sglang("start"),
    "sglang_stop": _sglang("stop"),
}


def run_command(job: Steerable, name: str, args: Mapping[str, Any], origin: str) -> str:
    handler = COMMANDS.get(name)
    if handler is None:
        raise JobError(f"unknown command {name!r}")
    return handler(job, args, origin)


__all__ = ["COMMANDS", "run_command"]
