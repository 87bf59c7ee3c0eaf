"""The FastAPI app: routes only. Each route checks, then hands over to its serving module."""
from __future__ import annotations

import asyncio
import contextlib
from typing import TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from atom_aot.server.engine_client import CallRejected, EngineCallError, EngineDeadError
from atom_aot.server.errors import APIError, bad_request, engine_unavailable, install_error_handlers
from atom_aot.server.guards import DEFAULT_MAX_BODY_BYTES, BodySizeLimit, api_key_check
from atom_aot.server.messages import EngineRequest, GetStats, Ping, StartProfile, StopProfile
from atom_aot.server.metrics import CONTENT_TYPE
from atom_aot.server.protocol import ChatCompletionRequest, CompletionRequest
from atom_aot.server.serving_chat import create_chat_completion
from atom_aot.server.serving_completions import create_completion
from atom_aot.server.state import ServerState

STATS_TIMEOUT_S = 10.0
R = TypeVar("R")


def build_app(state: ServerState, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    app = FastAPI(title="atom-aot", docs_url=None, redoc_url=None, openapi_url=None, lifespan=_lifespan)
    app.state.server = state
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=max_body_bytes)
    app.include_router(_open_routes())
    app.include_router(_guarded_routes(), dependencies=[Depends(api_key_check(state.api_key))])
    return app


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI):
    """The engine stops with the app (uvicorn re-raises SIGTERM right after, so not later)."""
    yield
    await app.state.server.engine.client.shutdown()


def _state(request: Request) -> ServerState:
    return request.app.state.server


def _open_routes() -> APIRouter:
    """Routes a load balancer or a scraper calls: no API key."""
    router = APIRouter()

    @router.get("/health")
    async def health(request: Request):
        state = _state(request)
        try:
            await state.engine.client.call(Ping(), timeout=state.health_timeout_s)
        except (EngineDeadError, EngineCallError, asyncio.TimeoutError):
            raise engine_unavailable("the engine does not answer") from None
        return {"status": "ok"}

    @router.get("/metrics")
    async def metrics(request: Request):
        state = _state(request)
        try:
            stats = await state.engine.client.call(GetStats(), timeout=STATS_TIMEOUT_S)
        except (EngineDeadError, EngineCallError, asyncio.TimeoutError):
            stats = None
        return Response(state.metrics.render(stats), media_type=CONTENT_TYPE)

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
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await create_chat_completion(_state(request), body, request)

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await create_completion(_state(request), body, request)

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
