"""OpenAI-shaped errors: whatever goes wrong, the client gets
`{"error": {"message", "type", "param", "code"}}` with a status that says whose fault it was.

Every framework error (invalid JSON, pydantic validation, unknown route, wrong method) is
turned into that shape here, so no handler has to think about it.
"""
from __future__ import annotations

import logging
import traceback

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("atom_aot.server")

# status -> the OpenAI error type that goes with it
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
               408: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"}
OVERLOADED_RETRY_AFTER_S = 1
MAX_SHOWN_INPUT_CHARS = 80
MAX_SHOWN_KEY_CHARS = 40         # a field path names the client's own keys (logit_bias, template variables)
MAX_LOGGED_FRAMES = 12           # an unexpected error's traceback in the log: its innermost frames only
MAX_LOGGED_CHARS = 8000          # and at most this much text (a deep recursion or a long value is not a log flood)


class APIError(Exception):
    """An error the client is told about, already in OpenAI's terms."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 error_type: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = error_type or ERROR_TYPES.get(status, "invalid_request_error")
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def engine_unavailable(why: str = "the engine process is not running") -> APIError:
    return APIError(503, f"{why}; the server cannot generate until it is restarted", code="engine_unavailable")


def shutting_down() -> APIError:
    return APIError(503, "the server is shutting down and takes no new requests; retry on another replica or "
                         "once it is back", code="server_shutting_down")


def overloaded(queued: int, asked: int, limit: int) -> APIError:
    return APIError(429, f"the engine is full: it holds {queued} sequences and this request adds {asked}, over the "
                         f"limit of {limit} (--max-queued-seqs); retry after {OVERLOADED_RETRY_AFTER_S}s",
                    code="overloaded", headers={"Retry-After": str(OVERLOADED_RETRY_AFTER_S)})


def stream_stalled(timeout: float) -> APIError:
    return APIError(408, f"the client left this response unread for more than {timeout:.0f}s while output waited "
                         f"(--stalled-stream-timeout), so its requests were aborted", code="stream_stalled")


def validation_error(exc: RequestValidationError) -> APIError:
    """The first pydantic complaint, in words a client understands, with the field as `param`. A
    union's members each complain; one that is not "wrong type" says more (a text part's bad text
    beats "content should be a string")."""
    errors = sorted(exc.errors(), key=lambda e: str(e.get("type", "")).endswith("_type"))
    if not errors:
        return bad_request("invalid request", code="invalid_value")
    first = errors[0]
    loc = [str(part)[:MAX_SHOWN_KEY_CHARS] for part in first.get("loc", ())
           if part != "body" and not _is_type_tag(part)]
    kind = first.get("type", "")
    if kind == "json_invalid":
        detail = first.get("ctx", {}).get("error", "not valid JSON")
        return bad_request(f"the request body is not valid JSON: {detail}", code="invalid_json")
    if kind == "missing" and not loc:
        return bad_request("the request body is missing: send a JSON object", code="invalid_json")
    if kind in ("model_attributes_type", "model_type") and not loc:
        hint = " (send Content-Type: application/json)" if isinstance(first.get("input"), (str, bytes)) else ""
        return bad_request(f"the request body must be a JSON object{hint}", code="invalid_json")
    if kind == "unsupported_field":      # protocol.py: a field this endpoint does not take
        ctx = first["ctx"]
        return bad_request(ctx["message"], param=".".join([*loc, ctx["field"]]), code=ctx["code"])
    param = ".".join(loc) or None
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if param:
        message = f"{param}: {message}"
    shown = repr(first.get("input"))
    if kind != "missing" and "input" in first and not isinstance(first["input"], (dict, list)) and \
            len(shown) <= MAX_SHOWN_INPUT_CHARS:
        message += f" (got {shown})"
    return bad_request(message, param=param, code="missing_field" if kind == "missing" else "invalid_value")


def _is_type_tag(part) -> bool:
    """pydantic names the union member that failed ("str", "list[TextPart]"): not a field."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool", "none") or "[" in part)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        return _http_error(request, exc).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.error("unhandled error on %s %s:\n%s", request.method, request.url.path[:200], bounded_traceback(exc))
        response = APIError(500, f"internal server error ({type(exc).__name__}); the server keeps running").response()
        request_id = getattr(request.state, "request_id", None)   # this response bypasses the id middleware
        if request_id is not None:
            response.headers["x-request-id"] = request_id.value
        return response


def bounded_traceback(exc: BaseException) -> str:
    """The traceback of `exc`, its innermost frames only and cut to MAX_LOGGED_CHARS."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-MAX_LOGGED_FRAMES))
    return text if len(text) <= MAX_LOGGED_CHARS else text[:MAX_LOGGED_CHARS] + f"... ({len(text)} characters)"


def _http_error(request: Request, exc: StarletteHTTPException) -> APIError:
    if exc.status_code == 404:
        return APIError(404, f"no route {request.method} {request.url.path}", code="not_found")
    if exc.status_code == 405:
        return APIError(405, f"{request.method} is not allowed on {request.url.path}", code="method_not_allowed")
    return APIError(exc.status_code, str(exc.detail))
