"""The catalog's routes: GET /models (paged or whole, §9.1) and /models/{author}/{slug}/endpoints
(§9.2), from the config's models as its overrides leave them."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from regen.sim.openrouter.lookup import find_model, model_endpoints
from regen.sim.openrouter.state import OpenRouterState
from regen.sim.openrouter.views import endpoint_entry, model_entry
from regen.sim.openrouter.wire import cf_headers, error_response, json_response


async def models(sim: OpenRouterState, request: web.Request) -> web.StreamResponse:
    all_models = sim.config.models
    total = len(all_models)
    q = request.query
    links: dict[str, Any] = {"next": None}
    if "offset" in q or "limit" in q:
        try:
            offset = max(0, int(q.get("offset", "0")))
            limit = min(1000, max(1, int(q.get("limit", "500"))))
        except ValueError:
            return error_response(400, "Invalid request parameters: offset/limit")
        page = all_models[offset : offset + limit]
        if offset + limit < total:
            links["next"] = f"/api/v1/models?offset={offset + limit}&limit={limit}"
    else:
        page = all_models
    data = [model_entry(m, model_endpoints(sim.config, m)) for m in page]
    return json_response(200, {"data": data, "links": links, "total_count": total}, cf_headers())


async def endpoints(sim: OpenRouterState, request: web.Request) -> web.StreamResponse:
    model_id = f"{request.match_info['author']}/{request.match_info['slug']}"
    model, variant = find_model(sim.config, model_id)
    if model is None:
        return error_response(404, f"Model {model_id} not found")
    # Percentiles are only given to authenticated callers (§9.2).
    header = request.headers.get("Authorization", "")
    key = header.partition(" ")[2].strip()
    authed = key in sim.config.api_keys or key == sim.config.management_key
    eps = model_endpoints(sim.config, model, variant)
    entry = model_entry(model, eps)
    data = {
        "id": model.id,
        "name": model.name,
        "created": model.created,
        "description": model.description,
        "architecture": entry["architecture"],
        "endpoints": [endpoint_entry(model, e, authed) for e in eps],
    }
    return json_response(200, {"data": data}, cf_headers())
