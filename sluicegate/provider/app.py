"""The aiohttp application: OpenAI-compatible /v1 endpoints with fault injection."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from typing import Any

from aiohttp import web

from sluicegate.provider import generation, responses
from sluicegate.provider.errors import error_response, invalid_request
from sluicegate.provider.faults import (
    Fault,
    Overrides,
    abort_connection,
    choose_fault,
    parse_overrides,
)
from sluicegate.provider.introspection import add_introspection_routes
from sluicegate.provider.responses import Kind, Plan, client_gone
from sluicegate.provider.settings import MockProviderSettings
from sluicegate.provider.state import STATE_KEY, ProviderState
from sluicegate.provider.stats import RequestRecord, safe_headers

PROVIDER_HEADER = "x-mock-provider"
# Prompts with long contexts easily exceed aiohttp's 1 MiB default body limit.
MAX_BODY_BYTES = 64 * 1024 * 1024
# Typed request keys arrived in aiohttp 3.13 (plain strings now warn); the project allows 3.10.
_RECORD_KEY: Any = (
    web.RequestKey("sluicegate_mock_record", RequestRecord)
    if hasattr(web, "RequestKey")
    else "sluicegate_mock_record"
)


def build_app(state: ProviderState) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[STATE_KEY] = state
    app.on_response_prepare.append(_on_response_prepare)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _list_models)
    add_introspection_routes(app.router)
    # Last, so it only sees what nothing else matched (a wrong method included): OpenAI
    # answers those with a JSON error too, not aiohttp's plain-text 404/405.
    app.router.add_route("*", "/{tail:.*}", _invalid_url)
    return app


async def _on_response_prepare(request: web.Request, response: web.StreamResponse) -> None:
    # A signal rather than per-handler code so aiohttp's own 404/405 answers carry it too.
    state = request.app[STATE_KEY]
    response.headers[PROVIDER_HEADER] = state.settings.name
    record = request.get(_RECORD_KEY)
    if isinstance(record, RequestRecord):
        state.stats.status_sent(record, response.status)


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    return await _serve_api(request, Kind.CHAT)


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _serve_api(request, Kind.TEXT)


async def _list_models(request: web.Request) -> web.StreamResponse:
    return await _serve_api(request, Kind.MODELS)


async def _serve_api(request: web.Request, kind: Kind) -> web.StreamResponse:
    arrived = asyncio.get_running_loop().time()
    state = request.app[STATE_KEY]
    settings = state.settings  # one consistent view even if /mock/config changes mid-request
    body: Any = None
    body_error: str | None = None
    if kind is not Kind.MODELS:
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError) as exc:
            body_error = f"We could not parse the JSON body of your request. ({exc})"
    model = body.get("model") if isinstance(body, dict) else None
    record = RequestRecord(
        method=request.method,
        path=request.path,
        model=model if isinstance(model, str) else None,
        stream=isinstance(body, dict) and body.get("stream") is True,
        authorization_present="Authorization" in request.headers,
        headers=safe_headers(request.headers),
    )
    request[_RECORD_KEY] = record
    state.stats.request_started(record)
    try:
        return await _answer(request, state, settings, kind, body, body_error, record, arrived)
    finally:
        state.stats.request_finished()


async def _answer(
    request: web.Request,
    state: ProviderState,
    settings: MockProviderSettings,
    kind: Kind,
    body: Any,
    body_error: str | None,
    record: RequestRecord,
    arrived: float,
) -> web.StreamResponse:
    started = time.monotonic()
    if settings.api_key is not None and not _authorized(request, settings.api_key):
        return error_response(
            401,
            "Incorrect API key provided. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            "invalid_request_error",
            code="invalid_api_key",
        )
    try:
        overrides = parse_overrides(request.headers, settings.name)
    except ValueError as exc:
        return invalid_request(str(exc))

    fault = choose_fault(settings, overrides.fault, state.fault_rng)
    if fault is not Fault.NONE:
        state.stats.fault_injected(record, fault.value)
    early = await _early_fault(request, settings, fault, overrides)
    if early is not None:
        return early

    if body_error is not None:
        return invalid_request(body_error)
    if kind is Kind.MODELS:
        payload = responses.models_payload(settings)
        if fault is Fault.CUT:
            await responses.cut_body(request, payload)
        return responses.json_answer(payload, request, started)

    plan_or_error = _plan(settings, kind, body, fault, overrides)
    if isinstance(plan_or_error, web.Response):
        return plan_or_error
    plan = plan_or_error
    pacer = generation.Pacer(
        ttft_ms=settings.ttft_ms if overrides.ttft_ms is None else overrides.ttft_ms,
        itl_ms=settings.itl_ms if overrides.itl_ms is None else overrides.itl_ms,
        jitter_ms=settings.jitter_ms,
        rng=state.jitter_rng,
        start=arrived,
    )
    if plan.stream:
        return await responses.stream(request, settings, kind, plan, pacer, started)
    await pacer.all_tokens(plan.tokens)
    if fault is Fault.GARBAGE:
        return responses.garbage_answer(request, started)
    payload = responses.completion_payload(kind, plan)
    if fault is Fault.CUT:
        await responses.cut_body(request, payload)
    return responses.json_answer(payload, request, started)


def _authorized(request: web.Request, api_key: str) -> bool:
    supplied = request.headers.get("Authorization", "")
    return hmac.compare_digest(supplied.encode(), f"Bearer {api_key}".encode())


async def _early_fault(
    request: web.Request, settings: MockProviderSettings, fault: Fault, overrides: Overrides
) -> web.StreamResponse | None:
    """Faults that replace the answer outright; None for NONE and CUT (which needs one)."""
    if fault is Fault.RATE_LIMIT:
        retry_after = (
            settings.retry_after_s if overrides.retry_after_s is None else overrides.retry_after_s
        )
        return error_response(
            429,
            f"Rate limit reached for requests (mock provider). Please try again in {retry_after}s.",
            "requests",
            code="rate_limit_exceeded",
            headers={
                "Retry-After": str(retry_after),
                **responses.ratelimit_headers(remaining=0, reset=f"{retry_after}s"),
            },
        )
    if fault is Fault.SERVER_ERROR:
        return error_response(
            500,
            "The server had an error while processing your request. Sorry about that!",
            "server_error",
        )
    if fault is Fault.UNAVAILABLE:
        return error_response(
            503,
            "The engine is currently overloaded, please try again later.",
            "server_error",
            code="service_unavailable",
        )
    if fault is Fault.RESET:
        abort_connection(request.transport)
        client_gone()
    if fault is Fault.HANG:
        # The client leaving cancels this wait (the server runs with handler_cancellation);
        # the bound only matters for clients that never give up.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(request.app[STATE_KEY].closing.wait(), settings.hang_max_s)
        abort_connection(request.transport)
        client_gone()
    return None


def _plan(
    settings: MockProviderSettings,
    kind: Kind,
    body: Any,
    fault: Fault,
    overrides: Overrides,
) -> Plan | web.Response:
    if not isinstance(body, dict):
        return invalid_request("The request body must be a JSON object.")
    model = body.get("model")
    if model is None or model == "":
        return invalid_request(
            "You must provide a model parameter.", param="model", code="missing_required_parameter"
        )
    if not isinstance(model, str):
        return invalid_request("'model' must be a string.", param="model")
    if settings.models and model not in settings.models:
        return invalid_request(
            f"The model `{model}` does not exist or you do not have access to it.",
            status=404,
            param="model",
            code="model_not_found",
        )
    if kind is Kind.CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return invalid_request(
                "Missing required parameter: 'messages'.",
                param="messages",
                code="missing_required_parameter",
            )
    elif "prompt" not in body:
        return invalid_request(
            "Missing required parameter: 'prompt'.",
            param="prompt",
            code="missing_required_parameter",
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        return invalid_request("'stream' must be a boolean.", param="stream")
    stream_options = body.get("stream_options")
    include_usage = isinstance(stream_options, dict) and stream_options.get("include_usage") is True

    wanted = settings.output_tokens if overrides.output_tokens is None else overrides.output_tokens
    cap: Any = body.get("max_completion_tokens")
    cap_param = "max_completion_tokens"
    if cap is None:
        cap, cap_param = body.get("max_tokens"), "max_tokens"
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        return invalid_request(f"'{cap_param}' must be an integer >= 1.", param=cap_param)
    tokens = wanted if cap is None else min(wanted, cap)
    return Plan(
        model=model,
        stream=bool(stream),
        include_usage=include_usage,
        tokens=tokens,
        # OpenAI reports "length" when max_tokens stopped the answer early.
        finish_reason="length" if tokens < wanted else "stop",
        prompt_tokens=generation.estimate_prompt_tokens(body),
        fault=fault,
        overrides=overrides,
    )


async def _invalid_url(request: web.Request) -> web.Response:
    return invalid_request(f"Invalid URL ({request.method} {request.path})", status=404)
