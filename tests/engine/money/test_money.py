"""Catalog filtering, the price ceiling and the budget gate."""

from __future__ import annotations

from decimal import Decimal

from regen.engine.backends.openrouter.catalog import (
    allowed_endpoints,
    exclusion_reason,
    find_endpoint,
    parse_endpoints,
)
from regen.engine.config.settings import ProviderSettings
from regen.engine.job.concurrency import AdaptiveLimit
from regen.engine.money.ledger import Ledger, PriceCeiling, prompt_token_bound
from regen.engine.schema import MoneyView
from tests.support.views import partial

BODY = {
    "data": {
        "endpoints": [
            {
                "provider_name": "Moonshot AI",
                "tag": "moonshotai",
                "quantization": "int4",
                "pricing": {"prompt": "0.0000006", "completion": "0.0000025"},
                "max_completion_tokens": None,
            },
            {
                "provider_name": "DeepInfra",
                "tag": "deepinfra/fp4",
                "quantization": "fp4",
                "pricing": {"prompt": "0.00000045", "completion": "0.0000022"},
                "max_completion_tokens": 16384,
            },
            {
                "provider_name": "Nebula",
                "tag": "nebula",
                "quantization": "nvfp4",
                "pricing": {"prompt": "0.0000005", "completion": "0.0000024"},
                "max_completion_tokens": None,
            },
            {
                "provider_name": "Together",
                "tag": "together",
                "quantization": "fp8",
                "pricing": {"prompt": "0.0000012", "completion": "0.000003"},
                "max_completion_tokens": 8192,
            },
        ]
    }
}


def test_prices_are_exact_decimals() -> None:
    endpoints = parse_endpoints(BODY)
    assert endpoints[1].completion_price * 1_000_000 == Decimal("2.2")
    assert endpoints[1].slug == "deepinfra"


def test_filters_and_reasons() -> None:
    endpoints = parse_endpoints(BODY)
    only_int4_fp8 = ProviderSettings(quantizations=["int4", "fp8"])
    assert [e.slug for e in allowed_endpoints(endpoints, only_int4_fp8)] == ["moonshotai", "together"]
    fp4 = ProviderSettings(quantizations=["fp4"])
    assert [e.slug for e in allowed_endpoints(endpoints, fp4)] == ["deepinfra", "nebula"], "fp4 covers nvfp4"
    assert (
        exclusion_reason(endpoints[0], ProviderSettings(ignore=["MoonshotAI"]), ())
        == "named in provider.ignore"
    )
    assert (
        exclusion_reason(endpoints[0], ProviderSettings(ignore=["moonshotai"]), ())
        == "named in provider.ignore"
    )
    assert exclusion_reason(endpoints[1], ProviderSettings(), {"DeepInfra"}) == "excluded at run time"
    capped = ProviderSettings(max_price={"completion": 2.5})
    assert exclusion_reason(endpoints[3], capped, ()) == "completion price above provider.max_price"
    assert exclusion_reason(endpoints[0], capped, ()) is None, "the cap is inclusive"
    assert "max completion tokens" in (
        exclusion_reason(endpoints[3], ProviderSettings(), (), max_tokens=16384) or ""
    )
    assert find_endpoint(endpoints, "Moonshot AI") is endpoints[0]


def test_reservation_uses_the_most_expensive_allowed_provider() -> None:
    endpoints = parse_endpoints(BODY)
    ceiling = PriceCeiling.of(
        e.price for e in allowed_endpoints(endpoints, ProviderSettings(), ("together",))
    )
    assert ceiling.completion == Decimal("0.0000025") and ceiling.prompt == Decimal("0.0000006")
    assert ceiling.reservation(1000, 16384) == Decimal("0.0006") + Decimal("0.04096")


def test_prompt_bound_is_at_least_the_bytes() -> None:
    messages = [{"role": "user", "content": "héllo wörld"}]
    assert prompt_token_bound(messages) >= len("héllo wörld".encode())


def test_ledger_gate_never_admits_past_the_budget() -> None:
    ledger = Ledger(Decimal("1.00"))
    admitted = 0
    while ledger.fits(Decimal("0.3")):
        ledger.reserve(Decimal("0.3"))
        admitted += 1
    assert admitted == 3
    ledger.release(Decimal("0.3"))
    ledger.charge(Decimal("0.25"))
    assert ledger.fits(Decimal("0.15")) and not ledger.fits(Decimal("0.16"))


def test_adaptive_limit_ignores_the_odd_429() -> None:
    limit = AdaptiveLimit(1000, minimum=10, adaptive=True, ceiling=1000)
    t = 100.0
    for i in range(2000):
        t += 0.002
        if i % 50 == 0:  # 2% throttled: normal for a busy provider
            limit.on_throttle(now=t)
        else:
            limit.on_success(now=t)
    assert limit.effective == 1000


def test_adaptive_limit_backs_off_once_per_storm_and_recovers() -> None:
    limit = AdaptiveLimit(1000, minimum=10, adaptive=True, ceiling=1000)
    for _ in range(50):
        limit.on_throttle(now=100.0)
    assert limit.effective == 700, "one decrease per cooldown, not per error"
    limit.on_throttle(now=101.5)
    assert limit.effective == 489  # int(700 * 0.7) in floating point
    limit.on_success(now=103.0)
    assert limit.effective == 489, "no recovery while the storm is recent"
    t = 107.0
    while limit.effective < 1000:
        limit.on_success(now=t)
        t += 1.5
    assert t < 130
    assert limit.set_configured(5000) == 1000, "clamped to the connection pool"


def test_estimates_are_split_into_pending_bills_and_unknowable_worst_cases() -> None:
    ledger = Ledger(Decimal(5))
    ledger.charge(Decimal("0.70"))
    ledger.charge(Decimal("0.03"), estimated=True, knowable=True)
    ledger.charge(Decimal("0.02"), estimated=True, knowable=True)
    ledger.charge(Decimal("0.04"), estimated=True, knowable=False)
    assert ledger.estimated == Decimal("0.09") and ledger.confirmed == Decimal("0.70")
    assert (ledger.estimates.pending_count, ledger.estimates.unknowable_count) == (2, 1)
    delta = ledger.confirm(Decimal("0.03"), Decimal("0.01"))
    assert delta == Decimal("-0.02") and ledger.spent == Decimal("0.77")
    assert ledger.estimates.pending == Decimal("0.02") and ledger.estimates.pending_count == 1
    assert ledger.confirmed == Decimal("0.71"), "a confirmed bill moves from estimated to confirmed"
    assert Ledger(None, unit="gpu_s").fits(Decimal(10**9)), "a ledger without a budget never blocks"


def test_the_summary_says_what_an_estimate_is() -> None:
    from regen.engine.control.headless import money_line

    money = partial(
        MoneyView,
        unit="usd",
        spent=0.8402,
        confirmed=0.7905,
        budget=5.0,
        pending={"amount": 0.0097, "requests": 2},
        unknowable={"amount": 0.04, "requests": 3},
    )
    line = money_line(money)
    assert line.startswith("spent $0.8402 of $5.00: $0.7905 confirmed")
    assert "$0.0097 estimated for 2 requests until their bill is looked up" in line
    assert "$0.0400 is the worst case of 3 requests cut before their generation id arrived" in line
    quiet: MoneyView = {
        **money,
        "pending": {"amount": 0, "requests": 0},
        "unknowable": {"amount": 0, "requests": 0},
    }
    assert money_line(quiet) == "spent $0.8402 of $5.00"
