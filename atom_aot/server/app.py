"""The FastAPI app: routes only. Each route reads its body (request_body.py: the JSON checks before
pydantic's), then hands over to its serving module."""
from __future__ import annotations

from typing import TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from atom_aot.runtime.processes.client import CallRejected, EngineCallError, EngineDeadError
from atom_aot.runtime.processes.messages import EngineRequest, StartProfile, StopProfile
from atom_aot.server.lifecycle.guards import DEFAULT_MAX_BODY_BYTES, BodySizeLimit, api_key_check
from atom_aot.server.lifecycle.metrics import CONTENT_TYPE
from atom_aot.server.lifecycle.request_ids import RequestIdHeader
from atom_aot.server.protocol.errors import APIError, bad_request, engine_unavailable, install_error_handlers, shutting_down
from atom_aot.server.protocol.request_body import read_request
from atom_aot.server.protocol.requests import ChatCompletionRequest, CompletionRequest
from atom_aot.server.serving.chat import create_chat_completion
from atom_aot.server.serving.completions import create_completion
from atom_aot.server.serving.tokenization import detokenize, tokenize, tokenizer_info
from atom_aot.server.state import ServerState
from atom_aot.version import __version__

R = TypeVar("R")


def build_app(state: ServerState, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    app = FastAPI(title="atom-aot", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    app.add_middleware(RequestIdHeader)      # outermost: a 413 carries the id too
    app.include_router(_open_routes())
    app.include_router(_guarded_routes(), dependencies=[Depends(api_key_check(state.api_key))])
    return app


def _state(request: Request) -> ServerState:
    return request.app.state.server


def _open_routes() -> APIRouter:
    """Routes a supervisor, a load balancer or a scraper calls: no API key, and none waits for the
    engine (they read what its process sentinel and heartbeats said)."""
    router = APIRouter()

    async def health(request: Request):
        """Liveness: the engine process runs (a long step does not make it fail)."""
        if not _state(request).engine.client.status().alive:
            raise engine_unavailable("the engine process exited")
        return {"status": "ok"}

    router.add_api_route("/health", health, methods=["GET"])
    router.add_api_route("/ping", health, methods=["GET"])

    @router.get("/ready")
    async def ready(request: Request):
        """Readiness: the engine is up and loaded, and the server is not shutting down."""
        state = _state(request)
        status = state.engine.client.status()
        if not status.alive:
            raise engine_unavailable("the engine process exited")
        if state.draining:
            raise shutting_down()
        return {"status": "ready", "engine_steps": status.heartbeat.steps if status.heartbeat else 0,
                "heartbeat_age_s": status.heartbeat_age_s, "queued_seqs": state.engine.num_queued_seqs}

    @router.get("/metrics")
    async def metrics(request: Request):
        state = _state(request)
        return Response(state.metrics.render(state.engine.client.status()), media_type=CONTENT_TYPE)

    return router


def _guarded_routes() -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def models(request: Request):
        state = _state(request)
        card = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "atom-aot",
                "max_model_len": state.info.max_model_len}
        return {"object": "list", "data": [card]}

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        state = _state(request)
        body = await read_request(request, ChatCompletionRequest, state.options.max_json_depth)
        return await create_chat_completion(state, body, request)

    @router.post("/v1/completions")
    async def completions(request: Request):
        state = _state(request)
        body = await read_request(request, CompletionRequest, state.options.max_json_depth)
        return await create_completion(state, body, request)

    @router.post("/tokenize")
    async def tokenize_route(request: Request):
        return await tokenize(_state(request), request)

    @router.post("/detokenize")
    async def detokenize_route(request: Request):
        return await detokenize(_state(request), request)

    @router.get("/tokenizer_info")
    async def tokenizer_info_route(request: Request):
        return tokenizer_info(_state(request))

    @router.get("/version")
    async def version():
        return {"version": __version__}

    @router.post("/start_profile")
    async def start_profile(request: Request):
        started = await _profile_call(_state(request), StartProfile())
        return JSONResponse({"status": "started", "dir": started.dir})

    @router.post("/stop_profile")
    async def stop_profile(request: Request):
        stopped = await _profile_call(_state(request), StopProfile())
        return JSONResponse({"status": "stopped", "trace": stopped.trace})

    return router


async def _profile_call(state: ServerState, request: EngineRequest[R]) -> R:
    try:
        return await state.engine.client.call(request)
    except CallRejected as e:
        raise bad_request(str(e), code="profiler_state") from None
    except EngineDeadError:
        raise engine_unavailable() from None
    except EngineCallError as e:
        raise APIError(500, f"the profiler failed: {e}") from None
