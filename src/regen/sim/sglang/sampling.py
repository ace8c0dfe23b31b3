"""A /generate request's `sampling_params`, checked the way SGLang 0.5.23 checks them, in its order.

Two gates, and which one refuses decides what the client sees (docs/sglang.md §4, "Errors"):

- the JSON contract (`api/v1/api_types.py`, run on the body before anything else): an unknown key
  or a value of the wrong JSON type is a 400 `{"error": "<serde's text>"}`, before any stream starts;
- the values (`SamplingParams.verify`, in the tokenizer manager): a ValueError, which a non-stream
  request gets as 400 `{"error": {"message": ...}}` and a stream as an error event inside a 200.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from regen.sim.sglang.request import Sampling

__all__ = [
    "BATCH",
    "SAMPLING_FIELDS",
    "ContractError",
    "NotSimulated",
    "RequestValueError",
    "decode_sampling",
    "not_simulated",
    "unexpected",
    "verify_sampling",
]

# The contract's SamplingParams keys, in its order (the order its unknown-key error lists them).
SAMPLING_FIELDS = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n",
    "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias",
    "sampling_seed", "custom_params", "beam_width", "watermark", "choice",
)  # fmt: skip
_INTS = ("max_new_tokens", "top_k", "min_new_tokens", "n", "stream_interval", "sampling_seed", "beam_width")
_FLOATS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")
_BOOLS = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim")
_STRINGS = ("json_schema", "regex", "ebnf", "structural_tag")
_CONSTRAINED = ("json_schema", "regex", "ebnf", "structural_tag", "stop_regex")
BATCH = (
    "regen's SGLang simulator serves one prompt per /generate request; batched {what} lists are not "
    "simulated (send one request per prompt)"
)


class ContractError(Exception):
    """The JSON contract refuses the body: 400 `{"error": message}` before anything runs."""


class RequestValueError(Exception):
    """A ValueError of SGLang's front end: 400, or an error event inside a stream."""


class NotSimulated(Exception):
    """A request the simulator would not serve faithfully: refused with a 400 that says so."""


def unexpected(v: Any) -> str:
    """serde's `Unexpected` display, which the contract's messages use."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    return "sequence" if isinstance(v, list) else "map" if isinstance(v, dict) else type(v).__name__


def _invalid(v: Any, expected: str) -> ContractError:
    return ContractError(f"invalid type: {unexpected(v)}, expected {expected}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def decode_sampling(raw: Any) -> dict[str, Any]:
    """The contract's decode of one `sampling_params` object: every key known, every value of its
    JSON type (null is the default). Returns the non-null values."""
    if raw is None:
        return {}
    if isinstance(raw, list):
        raise NotSimulated(BATCH.format(what="sampling_params"))
    if not isinstance(raw, dict):
        raise _invalid(raw, "struct SamplingParams")
    out: dict[str, Any] = {}
    for key, v in raw.items():
        if key not in SAMPLING_FIELDS:
            listed = ", ".join(f"`{f}`" for f in SAMPLING_FIELDS)
            raise ContractError(f"unknown field `{key}`, expected one of {listed}")
        if v is None:
            continue
        if key in _INTS and not _is_int(v):
            raise _invalid(v, "i64")
        if key in _FLOATS and not (isinstance(v, int | float) and not isinstance(v, bool)):
            raise _invalid(v, "f64")
        if key in _BOOLS and not isinstance(v, bool):
            raise _invalid(v, "a boolean")
        if key in _STRINGS and not isinstance(v, str):
            raise _invalid(v, "a string")
        if key == "stop" and not (
            isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v))
        ):
            raise _invalid(v, "a value or an array of values for StringOrList")
        if key == "stop_token_ids":
            if not isinstance(v, list):
                raise _invalid(v, "a sequence")
            for e in v:
                if not _is_int(e):
                    raise _invalid(e, "i64")
        out[key] = v
    return out


@dataclass(frozen=True, slots=True)
class _Range:
    bad: bool
    message: str


def not_simulated(values: dict[str, Any]) -> None:
    """Sampling the simulator does not simulate: refused (NotSimulated) rather than half-served."""
    for key in _CONSTRAINED:
        if values.get(key) is not None:
            raise NotSimulated(f"{key}: constrained decoding is not simulated")
    if values.get("n", 1) != 1:
        raise NotSimulated("n > 1 is not simulated (send one request per sample)")


def verify_sampling(values: dict[str, Any], eos_ids: tuple[int, ...]) -> Sampling:
    """SamplingParams.verify's checks in 0.5.23's order and words; raises RequestValueError."""
    max_new = int(values.get("max_new_tokens", 128))
    min_new = int(values.get("min_new_tokens", 0))
    temperature = float(values.get("temperature", 1.0))
    top_p = float(values.get("top_p", 1.0))
    top_k = int(values.get("top_k", -1))
    min_p = float(values.get("min_p", 0.0))
    freq = float(values.get("frequency_penalty", 0.0))
    pres = float(values.get("presence_penalty", 0.0))
    rep = float(values.get("repetition_penalty", 1.0))
    checks = (
        _Range(temperature < 0, f"temperature must be a non-negative finite number, got {temperature}."),
        _Range(not 0 < top_p <= 1, f"top_p must be in (0, 1], got {top_p}."),
        _Range(not 0 <= min_p <= 1, f"min_p must be in [0, 1], got {min_p}."),
        _Range(top_k < -1 or top_k == 0, f"top_k must be -1 (disable) or at least 1, got {top_k}."),
        _Range(not -2 <= freq <= 2, f"frequency_penalty must be in [-2, 2], got {freq}."),
        _Range(not -2 <= pres <= 2, f"presence_penalty must be in [-2, 2], got {pres}."),
        _Range(not 0 < rep <= 2, f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {rep}."),
        _Range(min_new < 0, f"min_new_tokens must be in [0, max_new_tokens], got {min_new}."),
        _Range(max_new < 0, f"max_new_tokens must be at least 0, got {max_new}."),
        _Range(
            not min_new <= max_new,
            f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {min_new}.",
        ),
    )
    for check in checks:
        if check.bad:
            raise RequestValueError(check.message)
    stop = values.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    stop_token_ids = tuple(values.get("stop_token_ids") or ())
    ignore_eos = bool(values.get("ignore_eos", False))
    # SGLang checks stop ids (stop_token_ids and the model's eos) only without ignore_eos.
    stop_ids = frozenset() if ignore_eos else frozenset(stop_token_ids) | frozenset(eos_ids)
    return Sampling(
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        stop_ids=stop_ids,
        stop_strs=tuple(s for s in stops if s),
        skip_special_tokens=bool(values.get("skip_special_tokens", True)),
        no_stop_trim=bool(values.get("no_stop_trim", False)),
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        seed=values.get("sampling_seed"),
        stream_interval=values.get("stream_interval"),
        stop_token_ids=stop_token_ids,
    )
