"""An impostor provider (config.impostor_providers, docs/fidelity.md): it declares the model and its
precision, follows the reference's answer for a few dozen tokens, then says something else; its
lengths and finish reasons drift by the configured amount."""

from __future__ import annotations

from regen.sim.openrouter.server import OpenRouterSim
from tests.support.openrouter_http import Api, endpoint

FIREWORKS = {"only": ["fireworks"]}
TOGETHER = {"only": ["together"]}


def prompt(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Question number {i}: explain it."}]


async def test_an_impostor_follows_the_reference_for_its_prefix_then_leaves_it(
    api: Api, osim: OpenRouterSim
) -> None:
    osim.config.impostor_providers = {"together": 0.0}
    osim.config.impostor_prefix_tokens = 24
    osim.config.reasoning_share = 0.0
    honest = await api.chat(provider=FIREWORKS, max_tokens=1000, reasoning={"enabled": False})
    impostor = await api.chat(provider=TOGETHER, max_tokens=1000, reasoning={"enabled": False})
    reference = honest.json["choices"][0]["message"]["content"].split(" ")
    served = impostor.json["choices"][0]["message"]["content"].split(" ")
    assert endpoint(osim, "Together").quantization == "fp8"  # it declares what it is allowed to
    assert served[:24] == reference[:24]
    assert served[24:] != reference[24:]
    # Streamed, it says the same as in one body.
    stream = await api.stream(provider=TOGETHER, max_tokens=1000, reasoning={"enabled": False})
    assert stream.content() == impostor.json["choices"][0]["message"]["content"]


async def test_an_impostors_lengths_and_finish_reasons_drift_by_the_setting(
    api: Api, osim: OpenRouterSim
) -> None:
    osim.config.impostor_providers = {"Together": 0.25}
    honest_lengths, drifted_lengths, cut = [], [], 0
    for i in range(40):
        a = await api.chat(provider=FIREWORKS, max_tokens=400, messages=prompt(i))
        b = await api.chat(provider=TOGETHER, max_tokens=400, messages=prompt(i))
        honest_lengths.append(a.json["usage"]["completion_tokens"])
        assert a.json["choices"][0]["finish_reason"] in ("stop", "length")
        if (
            b.json["choices"][0]["finish_reason"] == "length"
            and a.json["choices"][0]["finish_reason"] == "stop"
        ):
            cut += 1
        drifted_lengths.append(b.json["usage"]["completion_tokens"])
    assert sum(drifted_lengths) > 1.15 * sum(honest_lengths)
    assert 3 <= cut <= 20  # about a quarter of 40 run on to the cap
    osim.config.impostor_providers = {}
    again = await api.chat(provider=TOGETHER, max_tokens=400, messages=prompt(0))
    assert again.json["usage"]["completion_tokens"] == honest_lengths[0]
