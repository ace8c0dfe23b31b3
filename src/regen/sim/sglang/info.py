"""What /model_info, /server_info and /v1/models say, and their routes, old paths included
(docs/sglang.md, "Health and information")."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from regen.sim.sglang.state import SGLangState
from regen.sim.sglang.wire import json_response, not_found

__all__ = [
    "get_model_info_route",
    "get_server_info_route",
    "model_card",
    "model_card_route",
    "model_info",
    "model_info_route",
    "models_route",
    "server_info",
    "server_info_route",
]


def model_info(sim: SGLangState, legacy: bool = False) -> dict[str, Any]:
    cfg = sim.config
    info: dict[str, Any] = {
        "model_path": cfg.model_path,
        "tokenizer_path": cfg.tokenizer_path or cfg.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": cfg.weight_version,
        "has_image_understanding": False,
        "has_audio_understanding": False,
    }
    if legacy:
        return info
    return {
        "model_path": cfg.model_path,
        "served_model_name": cfg.served_name,
        "tokenizer_path": cfg.tokenizer_path or cfg.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": cfg.weight_version,
        "load_format": "auto",
        "reasoning_parser": cfg.reasoning_parser,
        "tool_call_parser": cfg.tool_call_parser,
        "disaggregation_mode": "null",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": cfg.model_type,
        "architectures": cfg.architectures,
    }


def server_info(sim: SGLangState) -> dict[str, Any]:
    """0.5.23's flat `server_args.resolved_dict()` (the subset simulated) plus the scheduler's facts.
    Arguments are as given on the command line: `context_length` and `max_running_requests` are
    None unless passed (the model's limit is /v1/models' max_model_len), and `enable_dp_attention`
    says whether attention is data-parallel over more than one rank."""
    cfg = sim.config
    sched = sim.scheduler
    args: dict[str, Any] = {
        "model_path": cfg.model_path,
        "tokenizer_path": cfg.tokenizer_path or cfg.model_path,
        "tokenizer_mode": "auto",
        "skip_tokenizer_init": False,
        "load_format": "auto",
        "trust_remote_code": cfg.trust_remote_code,
        "context_length": cfg.context_length,
        "is_embedding": False,
        "host": sim.host,
        "port": sim.port,
        "api_key": None,  # never echoed: the key would leak to anyone who can read this
        "served_model_name": cfg.served_name,
        "mem_fraction_static": cfg.mem_fraction_static,
        "max_running_requests": cfg.max_running_requests,
        "max_total_tokens": cfg.max_total_tokens,
        "chunked_prefill_size": cfg.chunked_prefill_size,
        "max_prefill_tokens": cfg.max_prefill_tokens,
        "schedule_policy": "fcfs",
        "schedule_conservativeness": cfg.schedule_conservativeness,
        "kv_cache_dtype": cfg.kv_cache_dtype,
        "tp_size": cfg.tp_size,
        "dp_size": cfg.dp_size,
        "pp_size": 1,
        "enable_dp_attention": cfg.enable_dp_attention and cfg.dp_size > 1,
        "max_queued_requests": cfg.max_queued_requests,
        "stream_interval": cfg.stream_interval,
        "incremental_streaming_output": cfg.incremental_streaming_output,
        "random_seed": cfg.seed,
        "watchdog_timeout": cfg.watchdog_timeout,
        "soft_watchdog_timeout": cfg.soft_watchdog_timeout,
        "speculative_algorithm": cfg.speculative_algorithm,
        "log_level": cfg.log_level,
        "log_level_http": cfg.log_level_http,
        "enable_metrics": cfg.enable_metrics,
        "decode_log_interval": cfg.decode_log_interval,
        "enable_cache_report": cfg.enable_cache_report,
        "reasoning_parser": cfg.reasoning_parser,
        "tool_call_parser": cfg.tool_call_parser,
        "skip_server_warmup": cfg.skip_server_warmup,
        "weight_version": cfg.weight_version,
    }
    kv_gb = round(cfg.max_total_tokens * 34_000 / 1e9, 2)
    return {
        **args,
        "max_total_num_tokens": cfg.max_total_tokens,
        "max_req_input_len": sim.context_len - 1,
        "startup_time": sim.stats.startup_phases.get("e2e"),
        "internal_states": [
            {
                "last_gen_throughput": sim.stats.gen_throughput,
                "memory_usage": {
                    "weight": 73.58,
                    "kvcache": kv_gb,
                    "token_capacity": cfg.max_total_tokens,
                    "graph": 1.91,
                },
                "effective_max_running_requests_per_dp": cfg.running_cap,
                "num_running_reqs": len(sched.running),
                "num_waiting_reqs": len(sched.waiting),
            }
        ],
        "version": cfg.version,
        "frontend": "python",
    }


def model_card(sim: SGLangState) -> dict[str, Any]:
    name = sim.config.served_name
    return {
        "id": name,
        "object": "model",
        "created": int(sim.stats.started_wall),
        "owned_by": "sglang",
        "root": name,
        "max_model_len": sim.context_len,
    }


# --- the routes ------------------------------------------------------------------------------------
def _deprecated(sim: SGLangState, old: str, new: str) -> None:
    sim.log.main(
        level="warning",
        message=f"The endpoint {old} is deprecated and will be removed in a future version. Please use {new} instead.",
    )


async def model_info_route(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    if sim.config.info_paths == "legacy":
        return await not_found(request)
    return json_response(model_info(sim))


async def get_model_info_route(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    legacy = sim.config.info_paths == "legacy"
    if not legacy:
        _deprecated(sim, "/get_model_info", "/model_info")
    return json_response(model_info(sim, legacy=legacy))


async def server_info_route(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    if sim.config.info_paths == "legacy":
        return await not_found(request)
    return json_response(server_info(sim))


async def get_server_info_route(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    info = server_info(sim)
    if sim.config.info_paths == "legacy":
        info.pop("frontend", None)
    else:
        _deprecated(sim, "/get_server_info", "/server_info")
    return json_response(info)


async def models_route(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    return json_response({"object": "list", "data": [model_card(sim)]})


async def model_card_route(sim: SGLangState, request: web.Request) -> web.StreamResponse:
    model = request.match_info["model"]
    if model != sim.config.served_name:
        return json_response(
            {
                "error": {
                    "message": f"The model '{model}' does not exist",
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": "model_not_found",
                }
            },
            404,
        )
    return json_response(model_card(sim))
