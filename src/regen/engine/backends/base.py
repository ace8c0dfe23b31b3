"""The contract between the dispatcher and a generation backend (docs/architecture.md).

The dispatcher knows prompts, one money gate and a `Backend`. A backend knows its wire, its errors
and its prices: it turns one prompt into one `AttemptOutcome`, and every failure into a `Failure`
that already says what to do (retry, give up, stop) in the operator's words. The dispatcher never
reads an HTTP status or a backend's own error class, and no backend touches the queue, the ledger
or a journal.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any, Protocol

from regen.engine.data.datasets import Prompt
from regen.engine.data.row import Usage
from regen.engine.data.tokenizer import TargetTokenizer
from regen.engine.errors import RegenError
from regen.engine.money.ledger import RoutePrice
from regen.engine.run.records import BackendFields
from regen.engine.run.recovery import Unsettled
from regen.engine.schema import BackendView
from regen.engine.units import Unit


class BackendError(RegenError, RuntimeError):
    """The backend cannot start or refuses an operator's request; the message is for the operator."""


class Disposition(StrEnum):
    """What the dispatcher does with an attempt that failed."""

    RETRY = "retry"  # back off, try again (counts against the prompt's attempt cap)
    GIVE_UP = "give_up"  # this prompt fails for this run; others go on
    FATAL = "fatal"  # stop dispatching: no other prompt can succeed either


@dataclass(frozen=True, slots=True)
class Failure:
    """A classified failure: what happened, in the operator's words, and what to do about it."""

    disposition: Disposition
    error_class: str  # counted per class in the snapshot: "rate_limited", "network", "abort", ...
    message: str
    throttle: bool = False  # feeds the adaptive concurrency limit
    hold_s: float | None = None  # hold every route this long: a limit on the whole account
    retry_after_s: float | None = None  # the earliest this prompt may go again
    refused: bool = False  # the request itself was refused: many in a row mean the settings are wrong
    streak_hint: str | None = None  # what to tell the operator when every request is refused so
    stop_reason: str = "fatal"  # for FATAL: "fatal", or "credits" when the account cannot pay
    # The backend itself is unreachable (no connection, its own edge failing), not this prompt:
    # the attempt does not count against the prompt, and a run of them holds all dispatch (an
    # outage) until a probe gets through.
    outage: bool = False
    sent: bool = True  # False: the request never left, so it cost nothing

    def __post_init__(self) -> None:
        # The error class keys the snapshot's `errors` (a JSON object: its keys must be plain str,
        # and orjson refuses a str subclass such as a backend's own StrEnum member) and the journals:
        # whoever builds the Failure, these are plain str from here on.
        for name in ("error_class", "message", "stop_reason", "streak_hint"):
            value = getattr(self, name)
            if value is not None and type(value) is not str:
                object.__setattr__(self, name, str(value))


def no_usage() -> Usage:
    return {"prompt_tokens": None, "completion_tokens": None, "reasoning_tokens": None, "cached_tokens": None}


@dataclass(slots=True)
class AttemptOutcome:
    """What one attempt produced; `failure` is None only for an answer that may become a row."""

    route: str | None = None  # the provider (OpenRouter) or worker (SGLang) that served it
    handle: str | None = None  # generation id or rid: what the backend's bill or abort is keyed by
    served_model: str | None = None
    finish_reason: str | None = None
    native_finish_reason: Any = None
    content: str = ""
    reasoning: str = ""
    prompt_ids: list[int] | None = None  # what the server was sent, when the backend sends ids
    output_ids: list[int] | None = None  # the server's own ids; None: the tokenizer stage fills them
    terminator_appended: bool = False  # the backend added the end-of-turn id itself (data contract §5.2)
    usage: Usage = field(default_factory=no_usage)
    cost: Decimal | None = None  # in the ledger's unit, when the answer carried it
    is_byok: bool | None = None
    ttft_s: float | None = None
    e2e_s: float = 0.0
    failure: Failure | None = None
    journal: BackendFields = field(default_factory=BackendFields)  # the backend's fields of the end record

    @property
    def completion_tokens(self) -> int:
        tokens = self.usage["completion_tokens"]
        return tokens if isinstance(tokens, int) else 0


@dataclass(frozen=True, slots=True)
class AccountUsage:
    """What the backend's account says it has billed in all, for the money of attempts cut before
    their handle arrived (docs/money.md, "Bounded by the key's usage")."""

    usage: Decimal | None  # lifetime total, in the ledger's unit; None: it could not be read
    account: str  # which account (key) the figure is of: a fingerprint, never the secret
    settled: bool = True  # False: it was still changing when the wait for it ran out
    waited_s: float = 0.0  # how long the reading waited for the figure to settle


class JobContext(Protocol):
    """What a backend's background tasks may ask of the job."""

    def event(self, name: str, /, **fields: Any) -> None: ...
    def fatal(self, reason: str, message: str) -> None: ...
    def budget_left(self) -> Decimal: ...
    @property
    def live(self) -> bool: ...
    def suggest_concurrency(self, ceiling: int | None, reason: str) -> None:
        """The most requests the backend wants in flight now (None: no opinion); the in-flight
        limit stays at or below it, whatever the operator set, until the backend says otherwise."""

    def answered(self, generation: bool) -> None:
        """The backend's server answered just now (a status line, response headers): a sign of
        life. `generation`: it was a generation's, which ends an outage at once; any other (a
        lookup, a credit read, `alive`) lets the one attempt that confirms it go out now
        (docs/faults.md, outages). Cheap: called on every response."""

    async def reachable(self) -> None:
        """Return once the backend is reachable: at once unless its lane is in an outage, else
        when that outage ends. What waits here (a bill's lookup) does not count the wait."""


class Standalone:
    """The JobContext of a backend opened without a job (`regen audit`, a probe): nothing listens,
    nothing steers, and no budget of its own (the caller bounds what it spends)."""

    live = True

    def event(self, name: str, /, **fields: Any) -> None: ...
    def fatal(self, reason: str, message: str) -> None: ...
    def budget_left(self) -> Decimal:
        return Decimal("Infinity")

    def suggest_concurrency(self, ceiling: int | None, reason: str) -> None: ...
    def answered(self, generation: bool) -> None: ...
    async def reachable(self) -> None: ...


OnHandle = Callable[[str | None], None]
OnRoute = Callable[[str], None]


class Routes(Protocol):
    """An ability: routes the backend chooses among, each with its per-token prices, that the operator
    (or the precision guard) can exclude: OpenRouter's providers. A backend without it sends every
    request where it alone decides (SGLang's servers)."""

    @property
    def excluded(self) -> Mapping[str, str]:
        """Route id -> who excluded it ("operator", "console", "guard", ...)."""

    def restore(self, excluded: Mapping[str, str]) -> None:
        """The routes earlier runs excluded, with who excluded them; called before `open`."""

    def route_id(self, name: str) -> str:
        """The stable id (routing slug) of a route named by a response or an operator."""

    def exclude(self, route: str, source: str) -> str:
        """Stop routing to `route` (an id from `route_id`); returns the operator's message.

        Raises BackendError when it cannot (the last route allowed)."""

    def include(self, route: str) -> str:
        """Route to `route` again; returns the operator's message."""

    def prices(self) -> list[RoutePrice]:
        """Per-token prices of the routes allowed now, for the planners (docs/money.md, docs/fleets.md)."""


class PrecisionGuard(Protocol):
    """An ability: the precisions a route must serve at, and the after-the-fact veto on an answer
    served at another (OpenRouter's precision guard: the answer is quarantined, its route excluded)."""

    @property
    def allowed_precisions(self) -> list[str] | None:
        """The precisions the settings allow, None: any."""

    def reject(self, outcome: AttemptOutcome) -> str | None:
        """Why an otherwise good answer must not become a row, or None. Called once per answer:
        cheap (a lookup)."""


class Account(Protocol):
    """An ability: an account that bills each attempt after the fact and keeps a billed total
    (OpenRouter's key: /generation and /key). Without it, what `charge` says is final (SGLang's
    GPU time, measured at the attempt)."""

    async def reconcile(self, pending: Unsettled) -> Decimal | None:
        """The billed cost of an attempt settled on an estimate, or None when it cannot be known."""

    async def account_usage(self, settle: bool) -> AccountUsage:
        """The account's billed total now; with `settle`, once it has stopped changing (bills reach
        it late). It bounds the money of attempts no bill can name (docs/money.md, "Bounded by the
        key's usage")."""


class Aborts(Protocol):
    """An ability: an attempt still in flight ended on the server by its rid (SGLang's
    /abort_request), so that work queued there can be taken back and sent elsewhere
    (docs/fleets.md, "Work taken back"). The attempt itself goes on to its end: the server's
    answer to the abort (or a late answer) is what it comes back with."""

    def abort(self, rid: str) -> None:
        """Ask the server to end `rid`, in the background, best effort; never raises."""


class Backend(Protocol):
    """A generation backend: one attempt at a time, many at once, nothing else of the job.

    Every backend implements this core. What only some can do is an ability (`routes`, `guard`,
    `account`, `aborts`): the backend's own object for it, or None when it has none; the engine and the
    console read these, never a stand-in that pretends.
    """

    name: str  # "openrouter" | "sglang": the rows' `backend`
    unit: Unit  # the ledger's unit (engine/units.py): dollars or GPU-seconds
    model: str  # the model the rows name
    thinking: bool  # requests ask the model to reason
    thinking_setting: str  # the setting that decides `thinking`, for messages
    title: str  # the backend's name in operators' messages ("OpenRouter")
    base_url: str  # where requests go, for a console's hello
    requests_per_minute: int | None  # a cap the backend's platform imposes, None for none
    # The attempt's handle is its rid (SGLang aborts by rid): the start record already names it, so
    # no gen record is journaled, and an attempt a crash left open is looked up by its rid.
    handle_is_rid: bool

    @property
    def tokenizer(self) -> TargetTokenizer | None:
        """The tokenizer the backend renders prompt ids and splits the server's ids with, once open;
        None where rows come back as text. Where every lane has one, rows arrive with all their ids:
        the job loads no second copy and starts a tokenizer worker only for a row that needs one
        (engine/data/tokenize_pool.py, `TokenizePool.start`)."""

    @property
    def routes(self) -> Routes | None:
        """Routes that can be excluded, with their prices (the console offers exclude keys only then)."""

    @property
    def guard(self) -> PrecisionGuard | None:
        """The after-the-fact veto on answers."""

    @property
    def account(self) -> Account | None:
        """The account whose bills arrive after the attempt."""

    @property
    def aborts(self) -> Aborts | None:
        """Attempts in flight ended on the server by rid (work taken back from a stalled fleet)."""

    def heard_at(self) -> float | None:
        """When (monotonic) a chunk of any of this backend's answers last arrived, or None: a backend
        whose answers stream is not silent, however long they take (docs/fleets.md, "A stalled fleet")."""

    def stall_sign(self, now: float) -> str | None:
        """The servers' own sign that they make nothing (docs/fleets.md, "A stalled fleet"), in
        words, or None: every server holding this backend's requests has shown one since before
        monotonic `now` (SGLang: its /metrics unanswered). A sign shortens the silence that makes a
        stall; it never makes one alone."""

    def check(self) -> None:
        """Settings problems found before any work (a missing key); raises BackendError."""

    async def open(self, context: JobContext) -> None:
        """Connect and check everything a run needs; raises BackendError with the reason."""

    async def alive(self) -> bool:
        """Whether the backend answers now, asked with a request that costs nothing and answers
        at once (OpenRouter: GET /key; SGLang: /health_generate): True as soon as a status line
        arrives from it. Asked every `job.outage_probe_s` while its lane is out; never raises."""

    def reservation(self, prompt: Prompt) -> Decimal:
        """The most this prompt's attempt can cost, in the ledger's unit."""

    async def attempt(
        self, prompt: Prompt, rid: str, on_handle: OnHandle, on_route: OnRoute
    ) -> AttemptOutcome:
        """Run one attempt, without retries; never raises for server or network trouble.

        `on_handle` is called as soon as the handle is known (the job journals it at once), and
        `on_route` when the serving route is.
        When the generation's status line (its response headers) arrives, the backend calls its
        context's `answered(True)`: that, not the attempt's end, is what ends an outage.
        """

    def charge(self, outcome: AttemptOutcome, reserved: Decimal) -> tuple[Decimal, bool]:
        """What the attempt cost and whether that is an estimate (then the account's `reconcile`
        may correct it)."""

    def row_request(self) -> dict[str, Any]:
        """The rows' `request` block: the sampling and length settings actually sent."""

    def row_server(self) -> dict[str, Any]:
        """The rows' `server` block."""

    def describe_fatal(self, failure: Failure) -> str:
        """The stop message for a FATAL failure, with what the operator can change."""

    def tasks(self) -> list[Coroutine[Any, Any, None]]:
        """Background work for the whole run (polling the account, watching servers)."""

    def view(self) -> BackendView:
        """The backend's part of the snapshot."""

    async def close(self) -> None:
        """Release connections; safe to call twice."""
