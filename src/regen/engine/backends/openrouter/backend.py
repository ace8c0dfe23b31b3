"""OpenRouter behind the backend contract: the client, the catalog and its prices, the precision
guard, the account (/key, /credits, /generation) and the platform's own limits.

Besides the core, it has every ability of engine/backends/base.py, each implemented here on the
backend itself: `routes` (its providers: excluded, priced), `guard` (the precision guard) and
`account` (bills looked up after the attempt, the key's usage).

docs/openrouter.md has the wire facts this relies on; docs/money.md the reservation rule.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from collections.abc import Coroutine, Mapping
from decimal import Decimal
from typing import Any

from regen.engine.backends.base import (
    AccountUsage,
    AttemptOutcome,
    BackendError,
    Disposition,
    Failure,
    JobContext,
    OnHandle,
    OnRoute,
)
from regen.engine.backends.openrouter.account import (
    answers,
    generation_cost,
    read_credits,
    read_usage,
    settled_usage,
)
from regen.engine.backends.openrouter.catalog import (
    CatalogError,
    Endpoint,
    allowed_endpoints,
    exclusion_reason,
    fetch_endpoints,
    find_endpoint,
    quantization_allowed,
    routing_of,
    verdict,
)
from regen.engine.backends.openrouter.client import AttemptResult, OpenRouterClient
from regen.engine.backends.openrouter.errors import (
    THROTTLE_CLASSES,
    AttemptError,
    ErrorClass,
    classify_status,
)
from regen.engine.config.settings import Settings
from regen.engine.data.datasets import Prompt
from regen.engine.data.row import Usage
from regen.engine.money.ledger import PER_MILLION, PriceCeiling, RoutePrice, prompt_token_bound, to_dollars
from regen.engine.run.recovery import Unsettled
from regen.engine.schema import BackendView, OpenRouterCredits, RouteView
from regen.engine.units import DOLLARS, Unit

# OpenRouter's platform limit on `:free` model variants (docs/openrouter.md §7.3).
FREE_MODEL_REQUESTS_PER_MINUTE = 20
# A platform 429 that names no reset waits this long: the free-model quota counts per minute.
PLATFORM_HOLD_DEFAULT_S = 60.0
# Refusals that say the request itself is wrong: many in a row with no row at all mean the settings are.
_REFUSED = frozenset({ErrorClass.BAD_REQUEST, ErrorClass.TOO_COSTLY})


def requested_thinking(reasoning: dict[str, Any] | None) -> bool:
    """Whether requests ask the model to reason (and return the reasoning)."""
    settings = reasoning or {}
    return bool(reasoning) and not settings.get("exclude", False) and settings.get("effort") != "none"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class OpenRouterBackend:
    """Generation through OpenRouter: dollars, providers as routes, a precision guard."""

    name = "openrouter"
    unit: Unit = DOLLARS
    thinking_setting = "openrouter.reasoning"
    title = "OpenRouter"
    tokenizer = None  # text comes back: the tokenizer workers make every row's ids
    handle_is_rid = False  # the generation id, known once the response's headers arrive

    def __init__(self, settings: Settings) -> None:
        self.settings = settings.openrouter
        self.reconcile_timeout_s = settings.job.reconcile_timeout_s
        self.model = self.settings.model
        self.base_url = self.settings.base_url
        self.thinking = requested_thinking(self.settings.reasoning)
        self.routing = routing_of(self.settings)
        self.client = OpenRouterClient(
            self.settings, pool_size=settings.job.concurrency, routing=self.routing
        )
        self.requests_per_minute = FREE_MODEL_REQUESTS_PER_MINUTE if self.model.endswith(":free") else None
        self.endpoints: list[Endpoint] = []
        self.excluded: dict[str, str] = {}  # routing slug -> who excluded it
        self.ceiling = PriceCeiling(Decimal(0), Decimal(0))
        self.credits: OpenRouterCredits = {}
        self._ignore: list[str] = sorted(self.settings.provider.ignore)
        self._context: JobContext | None = None
        self._credit_warned = False
        # Asked once per response: the catalog is fixed once the backend is open.
        self._endpoint_names: dict[str, Endpoint | None] = {}
        self._guard_verdicts: dict[str | None, str | None] = {}
        self._request = {
            "thinking": self.thinking,
            "max_tokens": self.settings.max_tokens,
            "temperature": self.settings.temperature,
            "top_p": self.settings.top_p,
            "min_p": None,
            "seed": None,
            "stream": self.settings.stream,
        }
        self._server = {"kind": "openrouter", "endpoint": "/api/v1/chat/completions"}

    # ------------------------------------------------------------------------------ abilities

    @property
    def routes(self) -> OpenRouterBackend:
        return self

    @property
    def guard(self) -> OpenRouterBackend:
        return self

    @property
    def account(self) -> OpenRouterBackend:
        return self

    def heard_at(self) -> None:
        """None: the stall rule watches the GPU lanes only (engine/job/deadline_control.py)."""
        return None

    def stall_sign(self, now: float) -> None:
        """None: OpenRouter's providers are many, and their silence is an outage's (docs/faults.md)."""
        return None

    @property
    def aborts(self) -> None:
        """None: OpenRouter has no way to end a request but closing it (nothing queues there to take back)."""
        return None

    # ------------------------------------------------------------------------------ lifecycle

    def check(self) -> None:
        if self.settings.api_key is None:
            raise BackendError(
                "no API key: set OPENROUTER_API_KEY (or openrouter.api_key in the settings file)"
            )

    async def open(self, context: JobContext) -> None:
        self._context = context
        self.client.on_answer = context.answered
        await self.client.open()
        try:
            await self._check_key()
            self.endpoints = await fetch_endpoints(self.client, self.model)
        except (BackendError, CatalogError) as exc:
            await self.client.close()
            raise BackendError(str(exc)) from None
        self._reprice()
        if not self.allowed():
            await self.client.close()
            raise BackendError(self._no_provider_message())

    async def _check_key(self) -> None:
        """Refuse to start on a key OpenRouter refuses, before any dataset work is sent."""
        try:
            status, body = await self.client.get_json("/key")
        except Exception as exc:
            raise BackendError(
                f"cannot reach {self.settings.base_url}: {type(exc).__name__}: {exc}"
            ) from None
        if status in (401, 403):
            raise BackendError(f"the API key was refused ({classify_status(status, body, {}).message})")

    async def close(self) -> None:
        await self.client.close()

    # ------------------------------------------------------------------------- routes (ability)

    def restore(self, excluded: Mapping[str, str]) -> None:
        self.excluded = dict(excluded)

    def allowed(self) -> list[Endpoint]:
        return allowed_endpoints(self.endpoints, self.routing, self.excluded, self.settings.max_tokens)

    def _reprice(self) -> None:
        self.ceiling = PriceCeiling.of(e.price for e in self.allowed())
        self._ignore = sorted(set(self.settings.provider.ignore) | set(self.excluded))

    def _no_provider_message(self) -> str:
        reasons = Counter(
            exclusion_reason(e, self.routing, self.excluded, self.settings.max_tokens) for e in self.endpoints
        )
        detail = "; ".join(f"{n} {why}" for why, n in reasons.items() if why) or "the model has no endpoints"
        return f"no provider of {self.model} is allowed by the routing settings ({detail})"

    def endpoint_named(self, name: str) -> Endpoint | None:
        """The catalog endpoint a response's provider (display name) or a slug names."""
        key = name.lower()
        if key not in self._endpoint_names:
            self._endpoint_names[key] = find_endpoint(self.endpoints, name)
        return self._endpoint_names[key]

    def route_id(self, name: str) -> str:
        endpoint = self.endpoint_named(name)
        return endpoint.slug if endpoint is not None else name.strip().lower()

    def exclude(self, route: str, source: str) -> str:
        if route in self.excluded:
            return f"{route} is already excluded"
        remaining = [e for e in self.allowed() if e.slug != route]
        if not remaining:
            raise BackendError(f"excluding {route} would leave no provider for {self.model}")
        self.excluded[route] = source
        self._reprice()
        return f"excluded {route}; {len({e.slug for e in remaining})} providers remain"

    def include(self, route: str) -> str:
        if route not in self.excluded:
            return f"{route} is not excluded"
        del self.excluded[route]
        self._reprice()
        return f"included {route}"

    def prices(self) -> list[RoutePrice]:
        return [e.price for e in self.allowed()]

    # ------------------------------------------------------------------------------- attempts

    async def alive(self) -> bool:
        answered = await answers(self.client)
        if answered and not self.settings.stream and self._context is not None:
            # A non-stream generation says nothing until it is done (docs/openrouter.md §13.18):
            # its headers would hold the job for a whole generation, so /key's answer ends the
            # outage instead (docs/faults.md, outages).
            self._context.answered(True)
        return answered

    def reservation(self, prompt: Prompt) -> Decimal:
        return self.ceiling.reservation(prompt_token_bound(prompt.messages), self.settings.max_tokens)

    async def attempt(
        self, prompt: Prompt, rid: str, on_handle: OnHandle, on_route: OnRoute
    ) -> AttemptOutcome:
        result = await self.client.complete(prompt.messages, self._ignore, on_handle, on_route)
        return self._outcome(result)

    def _outcome(self, result: AttemptResult) -> AttemptOutcome:
        usage = result.usage or {}
        details = usage.get("completion_tokens_details") or {}
        prompt_details = usage.get("prompt_tokens_details") or {}
        counts: Usage = {
            "prompt_tokens": _int(usage.get("prompt_tokens")),
            "completion_tokens": _int(usage.get("completion_tokens")),
            "reasoning_tokens": _int(details.get("reasoning_tokens")) if isinstance(details, dict) else None,
            "cached_tokens": _int(prompt_details.get("cached_tokens"))
            if isinstance(prompt_details, dict)
            else None,
        }
        return AttemptOutcome(
            route=result.provider,
            handle=result.generation_id,
            served_model=result.served_model,
            finish_reason=result.finish_reason,
            native_finish_reason=result.native_finish_reason,
            content=result.content,
            reasoning=result.reasoning,
            usage=counts,
            cost=None if result.cost is None else to_dollars(result.cost),
            is_byok=result.is_byok,
            ttft_s=result.ttft_s,
            e2e_s=result.e2e_s,
            failure=None if result.error is None else self._failure(result.error),
            journal={"model": result.served_model, "http": result.http_status},
        )

    def _failure(self, error: AttemptError) -> Failure:
        """OpenRouter's classification, translated into what the dispatcher acts on."""
        cls = error.error_class
        hold = None
        if error.platform_limit:
            hold = PLATFORM_HOLD_DEFAULT_S if error.retry_after_s is None else error.retry_after_s
        hint = None
        if cls is ErrorClass.TOO_COSTLY:
            hint = (
                "OpenRouter refuses each request's worst case as above its in-flight budget: "
                f"lower openrouter.max_tokens ({self.settings.max_tokens}) or add credits"
            )
        elif cls is ErrorClass.BAD_REQUEST:
            hint = "every request is refused as bad"
        return Failure(
            disposition=error.disposition,
            error_class=cls.value,
            message=error.message,
            throttle=cls in THROTTLE_CLASSES and not error.platform_limit,
            hold_s=hold,
            retry_after_s=error.retry_after_s,
            refused=cls in _REFUSED,
            streak_hint=hint,
            stop_reason="credits" if cls is ErrorClass.CREDITS else "fatal",
            outage=error.unreachable,
            sent=error.sent,
        )

    def charge(self, outcome: AttemptOutcome, reserved: Decimal) -> tuple[Decimal, bool]:
        """usage.cost when the answer carried it, else an estimate that errs high."""
        if outcome.failure is not None and not outcome.failure.sent:
            return Decimal(0), False  # the request never left: nothing can have been billed
        if outcome.cost is not None:
            return outcome.cost, False
        http = outcome.journal.get("http")
        if http is not None and http != 200:
            return Decimal(0), False  # refused before generating: nothing billed
        usage = outcome.usage
        prompt_tokens, completion_tokens = usage["prompt_tokens"], usage["completion_tokens"]
        if prompt_tokens is not None and completion_tokens is not None:
            endpoint = self.endpoint_named(outcome.route) if outcome.route else None
            prices = (
                PriceCeiling(endpoint.prompt_price, endpoint.completion_price) if endpoint else self.ceiling
            )
            return prices.estimate(prompt_tokens, completion_tokens), True
        return reserved, True

    def describe_fatal(self, failure: Failure) -> str:
        if failure.error_class == ErrorClass.CREDITS:
            return f"OpenRouter credits exhausted: {failure.message}"
        if failure.error_class == ErrorClass.NO_ENDPOINTS:
            p = self.routing
            constraints = ", ".join(
                f"{name}={value}"
                for name, value in (
                    ("ignore", self._ignore),
                    ("only", p.only),
                    ("order", p.order),
                    ("quantizations", p.quantizations),
                    ("max_price", p.max_price),
                    ("allow_fallbacks", p.allow_fallbacks),
                    ("max_tokens", self.settings.max_tokens),
                )
                if value not in (None, [], True)
            )
            return (
                f"no provider of {self.model} matches the routing constraints "
                f"({constraints or 'none set'}): {failure.message}"
            )
        return f"{failure.error_class}: {failure.message}"

    def row_request(self) -> dict[str, Any]:
        return self._request

    def row_server(self) -> dict[str, Any]:
        return self._server

    # ---------------------------------------------------------------------- the guard (ability)

    @property
    def allowed_precisions(self) -> list[str] | None:
        quantizations = self.routing.quantizations
        return None if quantizations is None else list(quantizations)

    def reject(self, outcome: AttemptOutcome) -> str | None:
        """Why a response's serving provider is outside the precision allowlist, or None."""
        route = outcome.route
        try:
            return self._guard_verdicts[route]
        except KeyError:
            verdict = self._guard_verdicts[route] = self._judge(route)
            return verdict

    def _judge(self, provider: str | None) -> str | None:
        if not self.settings.precision_guard or self.routing.quantizations is None:
            return None
        if not provider:
            return "the response names no serving provider"
        endpoint = self.endpoint_named(provider)
        if endpoint is None:
            return f"{provider} is not in the catalog for {self.model}"
        if not quantization_allowed(endpoint.quantization, self.routing.quantizations):
            return (
                f"{provider} serves {endpoint.quantization}, outside {', '.join(self.routing.quantizations)}"
            )
        return None

    # ----------------------------------------------------------------------- account (ability)

    async def reconcile(self, pending: Unsettled) -> Decimal | None:
        assert pending.generation_id is not None and self._context is not None, "looked up once open"
        return await generation_cost(
            self.client, pending.generation_id, self.reconcile_timeout_s, self._context.reachable
        )

    async def account_usage(self, settle: bool) -> AccountUsage:
        """The key's lifetime usage (/key), for bounding the money of attempts cut before their
        generation id arrived (docs/money.md, "Bounded by the key's usage")."""
        if settle:
            usage, settled, waited = await settled_usage(
                self.client, self.settings.usage_settle_s, self.settings.usage_settle_max_s
            )
        else:
            usage, settled, waited = await read_usage(self.client), True, 0.0
        return AccountUsage(usage, self._key_fingerprint(), settled, round(waited, 3))

    def _key_fingerprint(self) -> str:
        """Which key the usage is of, so a run resumed with another key is not bounded by the first
        one's figures; a hash prefix, from which the key cannot be recovered."""
        key = self.settings.api_key.get_secret_value() if self.settings.api_key is not None else ""
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def tasks(self) -> list[Coroutine[Any, Any, None]]:
        return [self._watch_credits()]

    async def _watch_credits(self) -> None:
        """Poll the key's credit; warn when it is below what the job may still spend, stop at zero."""
        context = self._context
        assert context is not None
        while True:
            try:
                self.credits = await read_credits(self.client)
            except Exception as exc:
                self.credits = {"checked_at": time.time(), "key_error": f"{type(exc).__name__}: {exc}"}
            remaining = self.credits.get("remaining")
            if remaining is not None:
                job_left = float(context.budget_left())
                if remaining <= 0 and context.live:
                    context.fatal("credits", f"OpenRouter credits exhausted (remaining ${remaining:.2f})")
                elif remaining < job_left and not self._credit_warned:
                    self._credit_warned = True
                    context.event(
                        "credits_low",
                        remaining=round(remaining, 4),
                        budget_left=round(job_left, 4),
                        message=f"the account has ${remaining:.2f} left, below the job's remaining budget ${job_left:.2f}",
                    )
            await asyncio.sleep(self.settings.key_poll_interval_s)

    # --------------------------------------------------------------------------------- view

    def view(self) -> BackendView:
        routes: list[RouteView] = []
        for endpoint in self.endpoints:
            allowed, word, reason = verdict(endpoint, self.routing, self.excluded, self.settings.max_tokens)
            routes.append(
                {
                    "name": endpoint.provider_name,
                    "slug": endpoint.slug,
                    "allowed": allowed,
                    "kept_out": word,
                    "reason": reason,
                    "prompt_per_m": float(endpoint.prompt_price * PER_MILLION),
                    "completion_per_m": float(endpoint.completion_price * PER_MILLION),
                    "precision": endpoint.quantization,
                }
            )
        return {
            "name": self.name,
            "unit": self.unit,
            "model": self.model,
            "routes": routes,
            "account": {"kind": "openrouter", **self.credits},
        }


__all__ = ["Disposition", "OpenRouterBackend", "requested_thinking"]
