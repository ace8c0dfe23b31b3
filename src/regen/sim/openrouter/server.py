"""`OpenRouterSim`: a real aiohttp server on loopback speaking OpenRouter's wire format.

One process, one event loop. Each request is served by its own aiohttp handler task; a stream wakes
every `chunk_interval_s` and flushes all tokens produced since its last flush in one write, so cost
scales with chunks, never with tokens. Money truth lives in `billing` (the simulated account's billing book); `requests` keeps a bounded
summary of every chat request for tests to assert on.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import signal
import time
from collections import Counter, deque
from decimal import Decimal
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

from regen.sim.configs import patched
from regen.sim.openrouter import edges, refusals
from regen.sim.openrouter import faults as fault_bodies
from regen.sim.openrouter.billing import BillingBook, GenerationRecord, ProviderAttempt
from regen.sim.openrouter.catalog import Pricing, SimEndpoint, SimModel
from regen.sim.openrouter.config import HTTP_FAULTS, SimConfig
from regen.sim.openrouter.limits import Hold, Limits, Refusal, preflight_estimate
from regen.sim.openrouter.plan import Plan, make_plan, rand_id
from regen.sim.openrouter.routing import (
    NoEndpoints,
    Prefs,
    RequestError,
    filter_endpoints,
    matches,
    matches_any,
    order_endpoints,
    parse_prefs,
)
from regen.sim.openrouter.stream import DONE, KEEPALIVE, ChunkBuilder, costs, reasoning_details, usage_object
from regen.sim.openrouter.text import CONTENT_CYCLE, REASONING_CYCLE, degenerate, span
from regen.sim.openrouter.tools import deltas, message_calls
from regen.sim.openrouter.views import endpoint_entry, endpoint_id, generation_body, model_entry

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_CUT_FAULTS = frozenset({"cut_mid_stream", "cut_nonstream_body"})
_METADATA_HEADERS = ("X-OpenRouter-Metadata", "X-OpenRouter-Experimental-Metadata")
_VARIANTS = frozenset({"nitro", "floor", "exacto", "free"})
_FREE_PRICING = Pricing(prompt="0", completion="0")
# The marker of an attempt refused by its provider's rate bucket, beside the fault classes.
_BUCKET_EMPTY = "upstream_rate_limited"


def _json(status: int, body: dict[str, Any], headers: dict[str, str]) -> web.Response:
    headers["Content-Type"] = "application/json"
    return web.Response(status=status, body=orjson.dumps(body), headers=headers)


def estimate_prompt_tokens(messages: list[Any]) -> int:
    """Deterministic stand-in for the native tokenizer: utf-8 bytes // 4 + 4 per message."""
    n = 0
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            n += len(content.encode())
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    n += len(part["text"].encode())
    return n // 4 + 4 * len(messages)


class _ClientGone(Exception):
    """The client closed the connection while a stream was being written."""


class OpenRouterSim:
    """The simulator. `config` may be replaced or mutated at any time; it is read per request."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config: SimConfig = config if config is not None else SimConfig()
        self.billing = BillingBook(lambda: self.config)
        self.limits = Limits(lambda: self.config)
        self.requests: deque[dict[str, Any]] = deque(maxlen=self.config.requests_maxlen)
        self.in_flight = 0
        self.peak_in_flight = 0
        self.total_requests = 0
        self.token_events = 0  # SSE events carrying tokens: what a client parses per request
        self.served: Counter[str] = Counter()
        self.faults_injected: Counter[str] = Counter()
        self._rng = random.Random(self.config.seed)
        self._sticky: dict[tuple[str, str], str] = {}
        self._runner: web.AppRunner | None = None
        self._host = "127.0.0.1"
        self._port: int | None = None

    # --- lifecycle -------------------------------------------------------------------------
    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_post("/api/v1/chat/completions", self._chat)
        r.add_get("/api/v1/key", self._key)
        r.add_get("/api/v1/auth/key", self._key)
        r.add_get("/api/v1/credits", self._credits)
        r.add_get("/api/v1/generation", self._generation)
        r.add_get("/api/v1/models", self._models)
        r.add_get("/api/v1/models/{author}/{slug}/endpoints", self._endpoints_route)
        r.add_get("/_sim/state", self._state_route)
        r.add_get("/_sim/ledger", self._ledger_route)
        r.add_get("/_sim/config", self._config_get)
        r.add_post("/_sim/config", self._config_post)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        # handler_cancellation off: a non-stream request keeps running (and is billed) after
        # the client leaves, as at OpenRouter (§1.4).
        runner = web.AppRunner(
            self.make_app(), access_log=None, handler_cancellation=False, shutdown_timeout=1.0
        )
        await runner.setup()
        # A deep backlog: 2000 clients connect at once and SYN retries would cost seconds.
        site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True)
        await site.start()
        self._runner = runner
        self._host = host
        self._port = int(runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("simulator not started")
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://{self._host}:{self.port}/api/v1"

    async def __aenter__(self) -> OpenRouterSim:
        if self._runner is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def state(self) -> dict[str, Any]:
        return {
            "ledger": self.billing.summary(),
            "counters": {
                "in_flight": self.in_flight,
                "peak_in_flight": self.peak_in_flight,
                "total_requests": self.total_requests,
                "token_events": self.token_events,
            },
            "served": dict(self.served),
            "faults_injected": dict(self.faults_injected),
            "limits": self.limits.summary(),
        }

    # --- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _headers(gen_id: str | None = None) -> dict[str, str]:
        h = {
            "server": "cloudflare",
            "access-control-allow-origin": "*",
            "access-control-expose-headers": "X-Generation-Id,cf-ray",
            "cf-ray": os.urandom(8).hex() + "-DFW",
        }
        if gen_id is not None:
            h["X-Generation-Id"] = gen_id
        return h

    def _error(
        self,
        status: int,
        message: str,
        *,
        gen_id: str | None = None,
        **extra: Any,
    ) -> web.Response:
        err: dict[str, Any] = {"message": message, "code": status, **extra}
        return _json(status, {"error": err}, self._headers(gen_id))

    def _auth(self, request: web.Request) -> str | web.Response:
        header = request.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            return self._error(401, "No auth credentials found")
        cfg = self.config
        if key not in cfg.api_keys and key != cfg.management_key:
            return self._error(401, "User not found.")
        return key

    def _find_model(self, name: str) -> tuple[SimModel | None, str | None]:
        base, _, variant = name.partition(":")
        for m in self.config.models:
            if base in (m.id, m.canonical_slug):
                if variant and (variant not in _VARIANTS or (variant == "free" and not m.free_providers)):
                    return None, None
                return m, variant or None
        return None, None

    def _endpoints(self, model: SimModel, variant: str | None = None) -> list[SimEndpoint]:
        eps = self._overridden(model)
        if variant == "free":
            # The free variant is a few providers' endpoints at zero price (§7.3, §10.1).
            names = model.free_providers
            eps = [e.model_copy(update={"pricing": _FREE_PRICING}) for e in eps if matches_any(e, names)]
        return eps

    def _overridden(self, model: SimModel) -> list[SimEndpoint]:
        overrides = self.config.endpoint_overrides
        if not overrides:
            return model.endpoints
        out: list[SimEndpoint] = []
        for e in model.endpoints:
            update: dict[str, Any] = {}
            for name, fields in overrides.items():
                if matches(e, name):
                    update.update(fields)
            if isinstance(update.get("pricing"), dict):
                update["pricing"] = Pricing(**{**e.pricing.model_dump(), **update["pricing"]})
            out.append(e.model_copy(update=update) if update else e)
        return out

    def _provider_rates(self, ep: SimEndpoint) -> dict[str, float]:
        pf = self.config.provider_faults
        if not pf:
            return {}
        rates: dict[str, float] = {}
        for name, r in pf.items():
            if matches(ep, name):
                rates.update(r)
        return rates

    # --- POST /chat/completions ----------------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.total_requests += 1
        self.in_flight += 1
        if self.in_flight > self.peak_in_flight:
            self.peak_in_flight = self.in_flight
        summary: dict[str, Any] = {
            "model": None,
            "provider": None,
            "max_tokens": None,
            "stream": None,
            "served_by": None,
            "error": None,
            "fault": None,
            "status": None,
            "gen_id": None,
            "cancelled": False,
        }
        self.requests.append(summary)
        try:
            resp = await self._chat_inner(request, summary)
            if summary["status"] is None:
                summary["status"] = resp.status
            return resp
        finally:
            self.in_flight -= 1

    async def _chat_inner(self, request: web.Request, summary: dict[str, Any]) -> web.StreamResponse:
        cfg = self.config
        auth = self._auth(request)
        if isinstance(auth, web.Response):
            summary["error"] = "unauthorized"
            return auth
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            summary["error"] = "bad_request"
            return self._error(
                400, "Invalid JSON in request body", metadata={"error_type": "invalid_request"}
            )
        if not isinstance(body, dict):
            summary["error"] = "bad_request"
            return self._error(
                400, "Request body must be a JSON object", metadata={"error_type": "invalid_request"}
            )
        summary["model"] = body.get("model")
        summary["provider"] = body.get("provider")
        summary["stream"] = body.get("stream") is True
        bad = self._validate(body)
        if bad is not None:
            summary["error"] = "bad_request"
            return self._error(400, bad, metadata={"error_type": "invalid_request"})
        max_tokens = body.get("max_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_completion_tokens")
        summary["max_tokens"] = max_tokens
        try:
            prefs = parse_prefs(body.get("provider"))
        except RequestError as exc:
            summary["error"] = "bad_request"
            return self._error(400, str(exc), metadata={"error_type": "invalid_request"})

        requested = body.get("model") or cfg.default_model
        names = [requested, *[m for m in body.get("models") or [] if m != requested]]
        resolved: list[tuple[SimModel, str | None]] = []
        for name in names:
            model, variant = self._find_model(name)
            if model is None:
                summary["error"] = "model_not_found"
                return self._error(
                    400,
                    f"{name} is not a valid model ID",
                    metadata={"error_type": "invalid_request"},
                    availability={
                        "code": "model_not_found",
                        "retryable": False,
                        "requested_models": [name],
                        "docs_url": "https://openrouter.ai/docs/errors#model_not_found",
                    },
                )
            resolved.append((model, variant))

        messages: list[Any] = body["messages"]
        prompt_tokens = estimate_prompt_tokens(messages)
        session_id = body.get("session_id") or request.headers.get("x-session-id")

        # Routing over the model list: each model's ordered endpoints, in model order.
        candidates: list[tuple[SimModel, SimEndpoint]] = []
        first_404: NoEndpoints | None = None
        for model, variant in resolved:
            try:
                eps = filter_endpoints(
                    model,
                    self._endpoints(model, variant),
                    prefs,
                    body,
                    prompt_tokens,
                    max_tokens,
                    cfg.rogue_providers,
                )
            except NoEndpoints as exc:
                first_404 = first_404 or exc
                continue
            sticky = None
            if session_id and not prefs.order:
                sticky = self._sticky.get((model.id, str(session_id)))
            model_sort = {"nitro": "throughput", "floor": "price"}.get(variant or "")
            ordered = order_endpoints(eps, prefs, self._rng, model_sort, sticky)
            candidates.extend((model, e) for e in ordered)
        if not candidates:
            assert first_404 is not None
            summary["error"] = "no_endpoints"
            return _json(404, first_404.body, self._headers())

        primary_model, primary = candidates[0]
        refused, hold = self._admit(
            summary, primary_model, primary, prompt_tokens, max_tokens, free=resolved[0][1] == "free"
        )
        if refused is not None:
            return refused
        try:
            return await self._serve_candidates(
                request,
                summary,
                body,
                prefs,
                candidates,
                prompt_tokens,
                max_tokens,
                session_id,
                requested,
                hold,
            )
        finally:
            # A request that ended unbilled (a fault, a reset) has no cost to settle.
            self.limits.release(hold)

    async def _serve_candidates(
        self,
        request: web.Request,
        summary: dict[str, Any],
        body: dict[str, Any],
        prefs: Prefs,
        candidates: list[tuple[SimModel, SimEndpoint]],
        prompt_tokens: int,
        max_tokens: int | None,
        session_id: Any,
        requested: str,
        hold: Hold | None,
    ) -> web.StreamResponse:
        """Draw faults, then try the candidate endpoints in order until one serves (§2.3 step 5)."""
        cfg = self.config
        primary_model, primary = candidates[0]
        fault = fault_bodies.draw(cfg.faults, self._rng)
        if fault == "http_402_in_flight":
            return self._fault_response(fault, primary_model, primary, None, summary)
        if fault == "reset_before_headers":
            return self._reset(request, summary, fault)

        gen_id = f"gen-{int(time.time())}-{rand_id()}"
        summary["gen_id"] = gen_id
        if fault in HTTP_FAULTS:
            return self._fault_response(fault, primary_model, primary, gen_id, summary)

        tried = candidates if prefs.allow_fallbacks else candidates[:1]
        attempts: list[ProviderAttempt] = []
        last: tuple[str, SimModel, SimEndpoint] | None = None
        rate_waits: list[float] = []
        for model, ep in tried:
            wait = self.limits.take_provider(model, ep)
            if wait > 0:
                # The provider's own limit: an upstream 429 for this attempt, then a fallback.
                attempts.append(self._failed_attempt(model, ep, 429))
                rate_waits.append(wait)
                last = (_BUCKET_EMPTY, model, ep)
                continue
            pfault = fault_bodies.draw(self._provider_rates(ep), self._rng)
            if pfault in HTTP_FAULTS:
                # Fails this attempt only; OpenRouter silently moves on (§2.3 step 5).
                status, _, _ = fault_bodies.http_fault(
                    pfault,
                    provider_name=ep.provider_name,
                    model_id=model.id,
                    retry_after_s=cfg.retry_after_s,
                    user_id=cfg.user_id,
                )
                attempts.append(self._failed_attempt(model, ep, status))
                last = (pfault, model, ep)
                self.faults_injected[pfault] += 1
                continue
            if pfault == "reset_before_headers":
                return self._reset(request, summary, pfault)
            if pfault == "http_402_in_flight":
                return self._fault_response(pfault, model, ep, gen_id, summary)
            plan = make_plan(
                cfg,
                _wants_metadata(request),
                body,
                gen_id,
                model,
                ep,
                prompt_tokens,
                max_tokens,
                fault or pfault,
                attempts,
                [e for _, e in candidates],
            )
            plan.session_id = str(session_id) if session_id else None
            plan.hold = hold
            plan.requested_model = requested
            summary["served_by"] = ep.tag
            summary["fault"] = plan.fault
            if plan.fault:
                self.faults_injected[plan.fault] += 1
            self.served[ep.tag] += 1
            if plan.session_id and not prefs.order:
                self._sticky[(model.id, plan.session_id)] = ep.tag
            if plan.stream:
                return await self._serve_stream(request, plan, summary)
            return await self._serve_json(request, plan)
        assert last is not None
        pfault, model, ep = last
        if pfault == _BUCKET_EMPTY:
            # Retry-After only when every provider tried gave a retry hint (§6.6).
            hint = min(rate_waits) if len(rate_waits) == len(attempts) else None
            return self._upstream_rate_limited(model, ep, gen_id, summary, hint)
        return self._fault_response(pfault, model, ep, gen_id, summary, count=False)

    @staticmethod
    def _validate(body: dict[str, Any]) -> str | None:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return "Invalid request parameters: 'messages' is required and must be a non-empty array"
        for m in messages:
            if not isinstance(m, dict) or m.get("role") not in _ROLES:
                return "Invalid request parameters: each message needs a valid 'role'"
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            return "Invalid request parameters: 'model' must be a string"
        models = body.get("models")
        if models is not None and (
            not isinstance(models, list) or not all(isinstance(m, str) for m in models)
        ):
            return "Invalid request parameters: 'models' must be an array of strings"
        for key in ("max_tokens", "max_completion_tokens"):
            v = body.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                return f"Invalid request parameters: '{key}' must be an integer >= 1"
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            return "Invalid request parameters: 'stream' must be a boolean"
        return None

    def _admit(
        self,
        summary: dict[str, Any],
        model: SimModel,
        ep: SimEndpoint,
        prompt_tokens: int,
        max_tokens: int | None,
        *,
        free: bool,
    ) -> tuple[web.Response | None, Hold | None]:
        """The account-level gates, in order: a negative balance refuses everything (free models
        too, §6.5 item 3), then the free-model counts, the pre-flight estimate and, for paid
        non-BYOK requests, the in-flight budget, whose hold the caller must settle or release."""
        if self.billing.balance < 0:
            summary["error"] = "negative_balance"
            return _json(402, refusals.negative_balance(self.config.user_id), self._headers()), None
        if free:
            refusal = self.limits.admit_free()
            if refusal is not None:
                return self._refuse(refusal, summary), None
        preflight = self._preflight(model, ep, prompt_tokens, max_tokens)
        if preflight is not None:
            summary["error"] = "payment_required"
            return preflight, None
        if free or self.config.byok or not self.config.in_flight_budget:
            # The in-flight budget covers neither free models nor BYOK requests (§6.5 item 2).
            return None, None
        wanted, prompt_cost, per_token = preflight_estimate(model, ep, prompt_tokens, max_tokens)
        refusal, hold = self.limits.admit_budget(prompt_cost + wanted * per_token, self.billing.balance)
        if refusal is not None:
            return self._refuse(refusal, summary), None
        return None, hold

    def _refuse(self, refusal: Refusal, summary: dict[str, Any]) -> web.Response:
        summary["error"] = refusal.label
        headers = self._headers()
        headers.update(refusal.headers)
        return _json(refusal.status, refusal.body, headers)

    @staticmethod
    def _failed_attempt(model: SimModel, ep: SimEndpoint, status: int) -> ProviderAttempt:
        return ProviderAttempt(
            endpoint_id=endpoint_id(model, ep),
            provider_name=ep.provider_name,
            model_permaslug=model.canonical_slug,
            status=status,
            latency_ms=0,
            upstream_id="",
        )

    def _upstream_rate_limited(
        self, model: SimModel, ep: SimEndpoint, gen_id: str, summary: dict[str, Any], wait: float | None
    ) -> web.Response:
        cfg = self.config
        summary["error"] = _BUCKET_EMPTY
        headers = self._headers(gen_id)
        if wait is not None and cfg.provider_rate_retry_after:
            headers["Retry-After"] = str(max(1, math.ceil(wait)))
        return _json(429, refusals.upstream_rate_limited(ep.provider_name, model.id, cfg.user_id), headers)

    def _preflight(
        self, model: SimModel, ep: SimEndpoint, prompt_tokens: int, max_tokens: int | None
    ) -> web.Response | None:
        """Refuse what the balance or key limit cannot cover at worst case (§6.5 item 1)."""
        remaining, source = self.billing.affordable()
        wanted, prompt_cost, per_token = preflight_estimate(model, ep, prompt_tokens, max_tokens)
        if prompt_cost + wanted * per_token <= remaining:
            return None
        can = max(0, math.floor((remaining - prompt_cost) / per_token)) if per_token > 0 else 0
        if source == "key_limit":
            tail = (
                "To increase, visit https://openrouter.ai/settings/keys and create a key "
                "with a higher monthly limit"
            )
        else:
            tail = "To increase, visit https://openrouter.ai/settings/credits and upgrade to a paid account"
        body = {
            "error": {
                "message": (
                    f"This request requires more credits, or fewer max_tokens. You "
                    f"requested up to {wanted} tokens, but can only afford {can}. {tail}"
                ),
                "code": 402,
                "metadata": {"provider_name": None},
            },
            "user_id": self.config.user_id,
        }
        return _json(402, body, self._headers())

    def _fault_response(
        self,
        fault: str,
        model: SimModel,
        ep: SimEndpoint,
        gen_id: str | None,
        summary: dict[str, Any],
        *,
        count: bool = True,
    ) -> web.Response:
        cfg = self.config
        if count:
            self.faults_injected[fault] += 1
        status, body, extra = fault_bodies.http_fault(
            fault,
            provider_name=ep.provider_name,
            model_id=model.id,
            retry_after_s=cfg.retry_after_s,
            user_id=cfg.user_id,
        )
        summary["error"] = fault
        summary["fault"] = fault
        headers = self._headers(gen_id)
        headers.update(extra)
        return _json(status, body, headers)

    def _reset(self, request: web.Request, summary: dict[str, Any], fault: str) -> web.Response:
        self.faults_injected[fault] += 1
        summary["error"] = fault
        summary["fault"] = fault
        summary["status"] = 0
        if request.transport is not None:
            request.transport.close()
        return web.Response(status=500)

    # --- billing ---------------------------------------------------------------------------
    def _bill(
        self,
        plan: Plan,
        completion: int,
        reasoning: int,
        finish: str | None,
        native: str | None,
        *,
        cancelled: bool,
        first_token_at: float | None,
    ) -> tuple[float, float, float]:
        """Debit the ledger once per generation; returns (cost, prompt part, completion part)."""
        cfg = self.config
        insured = cfg.zero_completion_insurance and (
            finish == "error" or (completion == 0 and finish is None)
        )
        if insured:
            cost = prompt_cost = completion_cost = 0.0
        else:
            cost, prompt_cost, completion_cost = costs(plan.ep, plan.prompt_tokens, completion)
        upstream = cost
        if cfg.byok:
            upstream, cost = cost, 0.0
        now_loop = asyncio.get_running_loop().time()
        latency = (first_token_at if first_token_at is not None else now_loop) - plan.started
        attempts = [
            *plan.attempts,
            ProviderAttempt(
                endpoint_id=endpoint_id(plan.model, plan.ep),
                provider_name=plan.ep.provider_name,
                model_permaslug=plan.model.canonical_slug,
                status=200,
                latency_ms=int(latency * 1000),
                upstream_id="chatcmpl-" + plan.gen_id[-20:].lower(),
            ),
        ]
        self.billing.record(
            GenerationRecord(
                id=plan.gen_id,
                request_id=plan.request_id,
                upstream_id="chatcmpl-" + plan.gen_id[-20:].lower(),
                model=plan.model.canonical_slug,
                provider_name=plan.ep.provider_name,
                tag=plan.ep.tag,
                prompt_tokens=plan.prompt_tokens,
                completion_tokens=completion,
                reasoning_tokens=reasoning,
                cost=cost,
                upstream_inference_cost=upstream if cfg.byok else 0.0,
                streamed=plan.stream,
                cancelled=cancelled,
                finish_reason=finish,
                native_finish_reason=native,
                created_at=plan.started_wall,
                completed_at=time.time(),
                latency_ms=int(latency * 1000),
                generation_time_ms=int((now_loop - plan.started) * 1000),
                is_byok=cfg.byok,
                session_id=plan.session_id,
                attempts=attempts,
            )
        )
        self.limits.settle(plan.hold, cost)
        return cost, prompt_cost, completion_cost

    def _bill_cancel(self, plan: Plan, produced: int, first_token_at: float | None) -> None:
        """§1.4: cancellation stops billing only at providers that support it."""
        if plan.ep.supports_cancellation:
            self._bill(
                plan,
                produced,
                min(produced, plan.reasoning_tokens),
                None,
                None,
                cancelled=True,
                first_token_at=first_token_at,
            )
        else:
            self._bill(
                plan,
                plan.completion_tokens,
                plan.reported_reasoning,
                plan.finish_reason,
                plan.native_finish_reason,
                cancelled=True,
                first_token_at=first_token_at,
            )

    def _usage(
        self, plan: Plan, completion: int, reasoning: int, billed: tuple[float, float, float]
    ) -> dict[str, Any] | None:
        cost, pc, cc = billed
        return usage_object(
            plan.prompt_tokens,
            completion,
            reasoning,
            cost,
            pc,
            cc,
            shape=plan.usage_shape,
            byok=self.config.byok,
        )

    def _router_metadata(self, plan: Plan) -> dict[str, Any]:
        return {
            "requested": plan.requested_model,
            "strategy": "fallback" if plan.attempts else "direct",
            "region": "DFW",
            "summary": f"available={len(plan.candidates)}, selected={plan.ep.provider_name}",
            "attempt": len(plan.attempts) + 1,
            "is_byok": self.config.byok,
            "endpoints": {
                "total": len(plan.model.endpoints),
                "available": [
                    {
                        "provider": e.provider_name,
                        "model": plan.model.canonical_slug,
                        "selected": e is plan.ep,
                    }
                    for e in plan.candidates
                ],
            },
            "attempts": [
                {"provider": a.provider_name, "model": a.model_permaslug, "status": a.status}
                for a in plan.attempts
            ],
        }

    # --- text ----------------------------------------------------------------------------------
    def _content_text(self, plan: Plan, start: int, end: int) -> str:
        """Content tokens [start, end), counted from the first content token."""
        if plan.degenerate:
            return degenerate(start, end)
        return span(CONTENT_CYCLE, plan.off_content, start, end)

    def _token_events(self, plan: Plan, cb: ChunkBuilder, a: int, b: int) -> bytes:
        """Events for tokens [a, b): one reasoning and one content event, or with tokens_per_event
        set, one event per aligned run of that many tokens (so timing never changes the count)."""
        r = plan.reasoning_tokens
        k = self.config.tokens_per_event or max(b - a, 1)
        out: list[bytes] = []
        pos = a
        while pos < b:
            end = min(b, (pos // k + 1) * k) if self.config.tokens_per_event else b
            if pos < r < end:
                end = r
            if pos < r:
                if plan.show_reasoning:
                    out.append(cb.reasoning(span(REASONING_CYCLE, plan.off_reasoning, pos, end)))
            elif plan.tools is None:
                out.append(cb.content(self._content_text(plan, pos - r, end - r)))
            else:
                out.extend(self._tool_answer_events(plan, cb, pos - r, end - r))
            pos = end
        self.token_events += len(out)
        return b"".join(out)

    def _tool_answer_events(self, plan: Plan, cb: ChunkBuilder, a: int, b: int) -> list[bytes]:
        """Content tokens [a, b) of a tool answer: the preamble's text, then one event per call
        fragment, as in the Kimi captures."""
        assert plan.tools is not None
        p = plan.tools.preamble
        out: list[bytes] = []
        if a < p:
            out.append(cb.content(self._content_text(plan, a, min(b, p))))
        if b > p:
            out.extend(cb.tool_calls([entry]) for entry in deltas(plan.tools.calls, max(a, p) - p, b - p))
        return out

    def _flush_upto(self, produced: int, stop_at: int) -> int:
        """How many of the produced tokens to send now: whole events only, unless it is the end."""
        k = self.config.tokens_per_event
        if k <= 0 or produced >= stop_at:
            return produced
        return produced - produced % k

    # --- non-stream ----------------------------------------------------------------------------
    async def _serve_json(self, request: web.Request, plan: Plan) -> web.StreamResponse:
        fault = plan.fault
        if fault == "endless_body":
            return await self._endless_json(request, plan)
        produced = plan.stop_at
        if fault == "error_body_200":
            produced = 0
        delay = plan.ttft + (produced / plan.tps if plan.tps != math.inf else 0.0)
        if delay > 0:
            await asyncio.sleep(delay)
        # Billed whether or not the client is still there: non-stream is billed in full (§1.4).
        first_at = plan.started + plan.ttft
        headers = self._headers(plan.gen_id)
        headers.update(self._edge_headers(plan))
        if fault == "error_body_200":
            self._bill(plan, 0, 0, None, None, cancelled=False, first_token_at=first_at)
            return _json(
                200, fault_bodies.error_body_200(plan.ep.provider_name, self.config.user_id), headers
            )
        errored = fault in ("error_choice_200", "mid_stream_error")
        finish: str | None
        native: str | None
        if errored:
            completion, reasoning = produced, min(produced, plan.reasoning_tokens)
            finish = native = "error"
        else:
            completion, reasoning = plan.completion_tokens, plan.reported_reasoning
            finish, native = plan.finish_reason, plan.native_finish_reason
        billed = self._bill(
            plan, completion, reasoning, finish, native, cancelled=False, first_token_at=first_at
        )
        r = min(plan.reasoning_tokens, completion)
        content_tokens = completion - r if not errored else max(0, produced - r)
        message: dict[str, Any] = {"role": "assistant"}
        text_tokens = content_tokens if plan.tools is None else min(content_tokens, plan.tools.preamble)
        if text_tokens == 0 and (fault == "reasoning_exhaustion" or plan.tools is not None):
            message["content"] = None
        else:
            message["content"] = self._content_text(plan, 0, text_tokens)
        message["refusal"] = None
        if r and plan.show_reasoning:
            rtext = span(REASONING_CYCLE, plan.off_reasoning, 0, r)
            message["reasoning"] = rtext
            message["reasoning_details"] = reasoning_details(rtext)
        else:
            message["reasoning"] = None
        if plan.tools is not None and content_tokens > text_tokens:
            message["tool_calls"] = message_calls(plan.tools.calls, content_tokens - text_tokens)
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": None,
            "finish_reason": finish,
            "native_finish_reason": native,
            "message": message,
        }
        if errored:
            choice["error"] = fault_bodies.provider_disconnected()
        out: dict[str, Any] = {
            "id": plan.gen_id,
            "object": "chat.completion",
            "created": plan.created,
            "model": plan.model.canonical_slug,
            "provider": plan.ep.provider_name,
            "system_fingerprint": None,
            "service_tier": None,
            "choices": [choice],
        }
        usage = self._usage(plan, completion, reasoning, billed)
        if usage is not None:
            out["usage"] = usage
        if plan.want_metadata:
            out["openrouter_metadata"] = self._router_metadata(plan)
        if fault == "trickle":
            return await self._trickle(request, orjson.dumps(out), headers, "application/json")
        if fault not in _CUT_FAULTS:
            return _json(200, out, headers)
        # Cut part-way: a Content-Length the body never reaches, then the connection closes.
        data = orjson.dumps(out)
        headers["Content-Type"] = "application/json"
        resp = web.StreamResponse(status=200, headers=headers)
        resp.content_length = len(data)
        with contextlib.suppress(ConnectionError):
            await resp.prepare(request)
            await resp.write(data[: max(1, int(len(data) * self.config.fault_position))])
        if request.transport is not None:
            request.transport.close()
        return resp

    # --- stream --------------------------------------------------------------------------------
    async def _serve_stream(
        self, request: web.Request, plan: Plan, summary: dict[str, Any]
    ) -> web.StreamResponse:
        headers = self._headers(plan.gen_id)
        headers.update(self._edge_headers(plan))
        headers["Content-Type"] = "text/event-stream"
        headers["Cache-Control"] = "no-cache"
        resp = web.StreamResponse(status=200, headers=headers)
        loop = asyncio.get_running_loop()
        first_at = plan.started + plan.ttft
        sent = 0
        started_tokens = False
        try:
            await resp.prepare(request)
            await resp.write(KEEPALIVE)  # seen on the wire before the first token
            await self._wait_first_token(request, resp, first_at)
            cb = ChunkBuilder(plan.gen_id, plan.ep.provider_name, plan.model.canonical_slug, plan.created)
            if plan.fault == "error_body_200":
                self._bill(plan, 0, 0, None, None, cancelled=False, first_token_at=first_at)
                err = fault_bodies.error_body_200(plan.ep.provider_name, self.config.user_id)
                await resp.write(cb.error_no_choices(err["error"]) + DONE)
                return resp
            if plan.fault == "endless_body":
                text, tokens = self._endless_text(plan)
                await resp.write(cb.role())
                pieces = await edges.endless(request, resp, cb.content(text), self.config.chunk_interval_s)
                self._bill_cancel(plan, pieces * tokens, first_at)
                summary["cancelled"] = True
                return resp
            if plan.fault == "trickle":
                # The whole answer, decided and billed now, then sent at the trickle's pace.
                data = cb.role() + self._token_events(plan, cb, 0, plan.stop_at)
                await edges.trickle(
                    request,
                    resp,
                    data + self._stream_tail(plan, cb, first_at),
                    self.config.trickle_bytes_per_s,
                )
                return resp
            await resp.write(cb.role())
            started_tokens = True
            sent = await self._pump(request, resp, plan, cb, first_at)
        except (_ClientGone, ConnectionError):
            produced = self._produced(plan, loop.time(), first_at) if started_tokens else 0
            self._bill_cancel(plan, max(sent, produced), first_at if started_tokens else None)
            summary["cancelled"] = True
            return resp
        except asyncio.CancelledError:
            # Server shutdown mid-stream: still account for what the provider produced.
            produced = self._produced(plan, loop.time(), first_at) if started_tokens else 0
            self._bill_cancel(plan, max(sent, produced), first_at if started_tokens else None)
            raise
        return await self._finish_stream(request, resp, plan, cb, first_at)

    async def _wait_first_token(
        self, request: web.Request, resp: web.StreamResponse, first_at: float
    ) -> None:
        loop = asyncio.get_running_loop()
        keepalive = max(self.config.keepalive_interval_s, 0.01)
        while True:
            remaining = first_at - loop.time()
            if remaining <= 0:
                return
            await asyncio.sleep(min(remaining, keepalive))
            _check_client(request)
            if loop.time() < first_at:
                await resp.write(KEEPALIVE)

    @staticmethod
    def _produced(plan: Plan, now: float, first_at: float) -> int:
        if now < first_at:
            return 0
        if plan.tps == math.inf:
            return plan.stop_at
        return min(plan.stop_at, int((now - first_at) * plan.tps) + 1)

    async def _pump(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        plan: Plan,
        cb: ChunkBuilder,
        first_at: float,
    ) -> int:
        """Flush produced tokens every chunk interval until `stop_at`; returns tokens sent."""
        loop = asyncio.get_running_loop()
        cfg = self.config
        interval = max(cfg.chunk_interval_s, 0.001)
        keepalive = max(cfg.keepalive_interval_s, 0.01)
        sent = 0
        last_write = loop.time()
        while sent < plan.stop_at:
            now = loop.time()
            produced = self._flush_upto(self._produced(plan, now, first_at), plan.stop_at)
            if produced > sent:
                data = self._token_events(plan, cb, sent, produced)
                sent = produced
                if data:
                    await resp.write(data)
                    last_write = now
            if now - last_write >= keepalive:
                await resp.write(KEEPALIVE)
                last_write = now
            if sent >= plan.stop_at:
                break
            # Sleep a whole interval, or until the next token if tokens are slower than that.
            next_token = first_at + sent / plan.tps
            await asyncio.sleep(max(interval, min(next_token - loop.time(), keepalive)))
            _check_client(request)
        return sent

    async def _finish_stream(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        plan: Plan,
        cb: ChunkBuilder,
        first_at: float,
    ) -> web.StreamResponse:
        if plan.fault in _CUT_FAULTS:
            # The connection drops with no error event and no [DONE] (§4.4, §13.17).
            self._bill_cancel(plan, plan.stop_at, first_at)
            if request.transport is not None:
                request.transport.close()
            return resp
        tail = self._stream_tail(plan, cb, first_at)
        with contextlib.suppress(ConnectionError):
            await resp.write(tail)
        return resp

    def _stream_tail(self, plan: Plan, cb: ChunkBuilder, first_at: float) -> bytes:
        """Bill the generation and return the events that end its stream (finish, usage, [DONE])."""
        fault = plan.fault
        tail: list[bytes] = []
        if fault in ("mid_stream_error", "error_choice_200"):
            produced = plan.stop_at
            self._bill(
                plan,
                produced,
                min(produced, plan.reasoning_tokens),
                "error",
                "error",
                cancelled=False,
                first_token_at=first_at,
            )
            err = fault_bodies.provider_disconnected()
            if fault == "mid_stream_error":
                tail.append(cb.error(err))
                if self.config.done_after_error:
                    tail.append(DONE)
            else:
                tail.append(cb.error_in_choice(err))
                tail.append(DONE)
        else:
            completion, reasoning = plan.completion_tokens, plan.reported_reasoning
            billed = self._bill(
                plan,
                completion,
                reasoning,
                plan.finish_reason,
                plan.native_finish_reason,
                cancelled=False,
                first_token_at=first_at,
            )
            usage = self._usage(plan, completion, reasoning, billed)
            extra: dict[str, Any] = {}
            if plan.want_metadata:
                extra["openrouter_metadata"] = self._router_metadata(plan)
            if usage is None:
                tail.append(cb.finish(plan.finish_reason, plan.native_finish_reason, **extra))
            else:
                tail.append(cb.finish(plan.finish_reason, plan.native_finish_reason))
                if plan.usage_shape == "B":
                    tail.append(cb.usage_b(usage, **extra))
                else:
                    tail.append(cb.usage_a(usage, **extra))
            tail.append(DONE)
        return b"".join(tail)

    # --- answers past the edge (config.EDGE_FAULTS) ------------------------------------------------
    def _edge_headers(self, plan: Plan) -> dict[str, str]:
        if plan.fault != "huge_headers":
            return {}
        return edges.padding_headers(self.config.huge_header_bytes, self.config.huge_header_count)

    def _endless_text(self, plan: Plan) -> tuple[str, int]:
        """About endless_chunk_bytes of content, and the tokens it counts for."""
        tokens = max(1, self.config.endless_chunk_bytes // 6)
        return self._content_text(plan, 0, tokens), tokens

    async def _endless_json(self, request: web.Request, plan: Plan) -> web.StreamResponse:
        """A chat.completion whose content string never closes (chunked, no length)."""
        first_at = plan.started + plan.ttft
        if plan.ttft > 0:
            await asyncio.sleep(plan.ttft)
        headers = self._headers(plan.gen_id)
        headers["Content-Type"] = "application/json"
        resp = web.StreamResponse(status=200, headers=headers)
        head = orjson.dumps(
            {"id": plan.gen_id, "object": "chat.completion", "provider": plan.ep.provider_name}
        )
        head = head[:-1] + b',"choices":[{"index":0,"message":{"role":"assistant","content":"'
        text, tokens = self._endless_text(plan)
        pieces = 0
        with contextlib.suppress(ConnectionError):
            await resp.prepare(request)
            await resp.write(head)
            pieces = await edges.endless(
                request, resp, orjson.dumps(text)[1:-1], self.config.chunk_interval_s
            )
        self._bill_cancel(plan, pieces * tokens, first_at)
        return resp

    async def _trickle(
        self, request: web.Request, data: bytes, headers: dict[str, str], content_type: str
    ) -> web.StreamResponse:
        headers["Content-Type"] = content_type
        resp = web.StreamResponse(status=200, headers=headers)
        resp.content_length = len(data)
        with contextlib.suppress(ConnectionError):
            await resp.prepare(request)
            await edges.trickle(request, resp, data, self.config.trickle_bytes_per_s)
        return resp

    # --- account and catalog routes ------------------------------------------------------------
    async def _key(self, request: web.Request) -> web.StreamResponse:
        auth = self._auth(request)
        if isinstance(auth, web.Response):
            return auth
        cfg = self.config
        usage, limit_remaining = self._account_figures()
        is_mgmt = auth == cfg.management_key
        data: dict[str, Any] = {
            "label": auth[:9] + "..." + auth[-3:] if len(auth) > 12 else auth,
            "limit": cfg.key_limit,
            "limit_remaining": limit_remaining,
            "limit_reset": cfg.key_limit_reset,
            "include_byok_in_limit": False,
            "usage": usage,
            "usage_daily": usage,
            "usage_weekly": usage,
            "usage_monthly": usage,
            "byok_usage": 0.0,
            "byok_usage_daily": 0.0,
            "byok_usage_weekly": 0.0,
            "byok_usage_monthly": 0.0,
            "is_free_tier": False,
            "is_management_key": is_mgmt,
            "is_provisioning_key": is_mgmt,
            "creator_user_id": cfg.user_id,
            "expires_at": None,
            "rate_limit": {
                "interval": "1h",
                "note": "This field is deprecated and safe to ignore.",
                "requests": -1,
            },
        }
        if cfg.free_model_limits:
            # Newer docs add the free-model day count to /key (§7.1).
            used, limit = self.limits.free.used_today(), self.limits.free_daily_limit()
            data["free_model_daily_requests"] = {
                "used": used,
                "limit": limit,
                "remaining": max(0, limit - used),
            }
        return _json(200, {"data": data}, self._headers())

    def _account_figures(self) -> tuple[float, float | None]:
        """(usage, limit_remaining) as /key and /credits report them: `account_staleness_s` old."""
        used = self.billing.usage_as_of(time.time() - self.config.account_staleness_s)
        limit = self.config.key_limit
        if limit is None:
            return float(used), None
        return float(used), float(Decimal(repr(limit)) - used)

    async def _credits(self, request: web.Request) -> web.StreamResponse:
        auth = self._auth(request)
        if isinstance(auth, web.Response):
            return auth
        cfg = self.config
        if cfg.credits_require_management_key and auth != cfg.management_key:
            return self._error(403, "Only management keys can perform this operation")
        data = {"total_credits": cfg.credits, "total_usage": self._account_figures()[0]}
        return _json(200, {"data": data}, self._headers())

    async def _generation(self, request: web.Request) -> web.StreamResponse:
        auth = self._auth(request)
        if isinstance(auth, web.Response):
            return auth
        gen_id = request.query.get("id")
        headers = self._headers()
        headers["cache-control"] = "private, no-store"
        if not gen_id:
            return _json(400, {"error": {"code": 400, "message": "Missing required parameter: id"}}, headers)
        rec = self.billing.get(gen_id)
        if rec is None or time.time() < rec.completed_at + self.config.generation_lookup_delay_s:
            # Eventual consistency: unknown until a while after completion (§8 Lag).
            return _json(404, {"error": {"message": f"Generation {gen_id} not found", "code": 404}}, headers)
        return _json(200, {"data": generation_body(rec, request.headers.get("User-Agent"))}, headers)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        models = self.config.models
        total = len(models)
        q = request.query
        links: dict[str, Any] = {"next": None}
        if "offset" in q or "limit" in q:
            try:
                offset = max(0, int(q.get("offset", "0")))
                limit = min(1000, max(1, int(q.get("limit", "500"))))
            except ValueError:
                return self._error(400, "Invalid request parameters: offset/limit")
            page = models[offset : offset + limit]
            if offset + limit < total:
                links["next"] = f"/api/v1/models?offset={offset + limit}&limit={limit}"
        else:
            page = models
        data = [model_entry(m, self._endpoints(m)) for m in page]
        return _json(200, {"data": data, "links": links, "total_count": total}, self._headers())

    async def _endpoints_route(self, request: web.Request) -> web.StreamResponse:
        model_id = f"{request.match_info['author']}/{request.match_info['slug']}"
        model, variant = self._find_model(model_id)
        if model is None:
            return self._error(404, f"Model {model_id} not found")
        # Percentiles are only given to authenticated callers (§9.2).
        header = request.headers.get("Authorization", "")
        key = header.partition(" ")[2].strip()
        authed = key in self.config.api_keys or key == self.config.management_key
        endpoints = self._endpoints(model, variant)
        entry = model_entry(model, endpoints)
        data = {
            "id": model.id,
            "name": model.name,
            "created": model.created,
            "description": model.description,
            "architecture": entry["architecture"],
            "endpoints": [endpoint_entry(model, e, authed) for e in endpoints],
        }
        return _json(200, {"data": data}, self._headers())

    # --- admin -------------------------------------------------------------------------------
    async def _state_route(self, request: web.Request) -> web.StreamResponse:
        return _json(200, self.state(), {})

    async def _ledger_route(self, request: web.Request) -> web.StreamResponse:
        """Every billed generation (id, provider, cost): what a test compares a client's ledger with."""
        records = [
            {"id": rec.id, "provider": rec.provider_name, "cost": rec.cost, "cancelled": rec.cancelled}
            for rec in self.billing.records
        ]
        return _json(200, {"billed_total": str(self.billing.billed_total), "records": records}, {})

    async def _config_get(self, request: web.Request) -> web.StreamResponse:
        return _json(200, self.config.model_dump(), {})

    async def _config_post(self, request: web.Request) -> web.StreamResponse:
        try:
            patch = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _json(400, {"error": "body is not JSON"}, {})
        if not isinstance(patch, dict):
            return _json(400, {"error": "patch must be a JSON object"}, {})
        try:
            new = patched(self.config, patch)
        except ValidationError as exc:
            return _json(400, {"error": str(exc)}, {})
        self.apply_config(new)
        return _json(200, {"ok": True, "config": new.model_dump()}, {})

    def apply_config(self, config: SimConfig) -> None:
        """Swap the whole config; reseeds the fault RNG when the seed changed."""
        if config.seed != self.config.seed:
            self._rng.seed(config.seed)
        if config.requests_maxlen != self.requests.maxlen:
            self.requests = deque(self.requests, maxlen=config.requests_maxlen)
        self.config = config


async def serve_forever(config: SimConfig, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve until SIGINT/SIGTERM, after printing one "listening" line to stdout."""
    sim = OpenRouterSim(config)
    await sim.start(host, port)
    print(f"regen sim openrouter listening on http://{host}:{sim.port}/api/v1", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    try:
        await stop.wait()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        await sim.stop()


def _wants_metadata(request: web.Request) -> bool:
    return any(request.headers.get(h, "").lower() == "enabled" for h in _METADATA_HEADERS)


def _check_client(request: web.Request) -> None:
    transport = request.transport
    if transport is None or transport.is_closing():
        raise _ClientGone


__all__ = ["OpenRouterSim", "estimate_prompt_tokens", "serve_forever"]
