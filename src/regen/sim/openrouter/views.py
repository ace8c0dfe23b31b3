"""JSON shapes of the read-only routes: /generation (§8), /models (§9.1), /endpoints (§9.2)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from regen.sim.openrouter.billing import GenerationRecord
from regen.sim.openrouter.catalog import SimEndpoint, SimModel


def iso_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def endpoint_id(model: SimModel, ep: SimEndpoint) -> str:
    h = hashlib.blake2b(f"{model.id}|{ep.tag}".encode(), digest_size=16).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def generation_body(rec: GenerationRecord, user_agent: str | None) -> dict[str, Any]:
    return {
        "created_at": iso_time(rec.created_at),
        "model": rec.model,
        "app_id": None,
        "external_user": None,
        # OpenRouter reports streamed:true even for non-stream requests (§8 oddities).
        "streamed": True,
        "cancelled": rec.cancelled,
        "latency": rec.latency_ms,
        "moderation_latency": None,
        "generation_time": rec.generation_time_ms,
        # Normalised counts differ from native ones; usage matches the native counts (§8).
        "tokens_prompt": max(0, rec.prompt_tokens - 2),
        "tokens_completion": rec.completion_tokens + (1 if rec.completion_tokens else 0),
        "native_tokens_prompt": rec.prompt_tokens,
        "native_tokens_completion": rec.completion_tokens,
        "native_tokens_completion_images": None,
        "native_tokens_reasoning": rec.reasoning_tokens,
        "native_tokens_cached": 0,
        "num_media_prompt": None,
        "num_input_audio_prompt": None,
        "num_media_completion": 0,
        "num_search_results": None,
        "num_fetches": None,
        "web_search_engine": None,
        "origin": "",
        "is_byok": rec.is_byok,
        "finish_reason": rec.finish_reason,
        "native_finish_reason": rec.native_finish_reason,
        "service_tier": None,
        "usage": rec.cost,
        "router": None,
        "provider_responses": [
            {
                "endpoint_id": a.endpoint_id,
                "id": a.upstream_id or None,
                "is_byok": rec.is_byok,
                "latency": a.latency_ms,
                "model_permaslug": a.model_permaslug,
                "provider_name": a.provider_name,
                "status": a.status,
            }
            for a in rec.attempts
        ],
        "user_agent": user_agent,
        "http_referer": None,
        "request_id": rec.request_id,
        "session_id": rec.session_id,
        "preset_id": None,
        "api_type": "completions",
        "id": rec.id,
        "upstream_id": rec.upstream_id,
        "total_cost": rec.cost,
        "cache_discount": None,
        "upstream_inference_cost": rec.upstream_inference_cost,
        "provider_name": rec.provider_name,
        "response_cache_source_id": None,
        "data_region": "global",
    }


def architecture(model: SimModel) -> dict[str, Any]:
    modality = "+".join(model.input_modalities) + "->text"
    return {
        "modality": modality,
        "input_modalities": list(model.input_modalities),
        "output_modalities": ["text"],
        "tokenizer": model.tokenizer,
        "instruct_type": None,
    }


def model_entry(model: SimModel, endpoints: list[SimEndpoint]) -> dict[str, Any]:
    cheapest = min(endpoints, key=lambda e: (float(e.pricing.completion), float(e.pricing.prompt)))
    top = max(endpoints, key=lambda e: e.max_completion_tokens or model.context_length)
    params = sorted({p for e in endpoints for p in e.supported_parameters})
    pricing = {
        "prompt": cheapest.pricing.prompt,
        "completion": cheapest.pricing.completion,
        "request": "0",
        "image": "0",
        "web_search": "0",
        "internal_reasoning": "0",
    }
    if cheapest.pricing.input_cache_read is not None:
        pricing["input_cache_read"] = cheapest.pricing.input_cache_read
    return {
        "id": model.id,
        "canonical_slug": model.canonical_slug,
        "hugging_face_id": model.hugging_face_id,
        "name": model.name,
        "created": model.created,
        "description": model.description,
        "context_length": model.context_length,
        "architecture": architecture(model),
        "pricing": pricing,
        "top_provider": {
            "context_length": top.context_length,
            "max_completion_tokens": top.max_completion_tokens,
            "is_moderated": False,
        },
        "per_request_limits": None,
        "supported_parameters": params,
        "default_parameters": {},
        "reasoning": {
            "supported_efforts": ["high", "medium", "low", "none"] if model.reasoning else [],
            "default_effort": "medium" if model.reasoning else None,
            "default_enabled": model.reasoning,
            "mandatory": False,
            "supports_max_tokens": model.reasoning,
        },
        "expiration_date": None,
        "knowledge_cutoff": None,
        "links": {"details": f"/api/v1/models/{model.id}/endpoints"},
    }


def endpoint_entry(model: SimModel, ep: SimEndpoint, authed: bool) -> dict[str, Any]:
    latency = throughput = None
    if authed:
        t = ep.ttft_s
        latency = {
            "p50": round(t, 3),
            "p75": round(t * 1.3, 3),
            "p90": round(t * 1.8, 3),
            "p99": round(t * 3.0, 3),
        }
        s = ep.tokens_per_s
        throughput = {
            "p50": round(s, 1),
            "p75": round(s * 0.85, 1),
            "p90": round(s * 0.65, 1),
            "p99": round(s * 0.35, 1),
        }
    pricing: dict[str, Any] = {
        "prompt": ep.pricing.prompt,
        "completion": ep.pricing.completion,
        "request": ep.pricing.request,
        "image": ep.pricing.image,
    }
    if ep.pricing.input_cache_read is not None:
        pricing["input_cache_read"] = ep.pricing.input_cache_read
    return {
        "name": f"{ep.provider_name}: {model.name.split(': ', 1)[-1]}",
        "model_id": model.id,
        "model_name": model.name,
        "context_length": ep.context_length,
        "pricing": pricing,
        "provider_name": ep.provider_name,
        "tag": ep.tag,
        "quantization": ep.quantization,
        "max_completion_tokens": ep.max_completion_tokens,
        "max_prompt_tokens": ep.max_prompt_tokens,
        "supported_parameters": list(ep.supported_parameters),
        "status": ep.status,
        "uptime_last_5m": ep.uptime_last_5m,
        "uptime_last_30m": ep.uptime_last_30m,
        "uptime_last_1d": ep.uptime_last_1d,
        "latency_last_30m": latency,
        "throughput_last_30m": throughput,
        "supports_implicit_caching": ep.supports_implicit_caching,
    }
