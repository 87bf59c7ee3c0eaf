"""What stands before the handlers: a request body size limit and the API key check."""
from __future__ import annotations

import hmac

from fastapi import Request

from atom_aot.server.protocol.errors import APIError

DEFAULT_MAX_BODY_BYTES = 4 << 20


class BodySizeLimit:
    """ASGI middleware: refuse (413) a body over `max_bytes` before any of it is parsed.

    The body is read here (at most `max_bytes` + one chunk) and handed on; later `receive()`
    calls go to the server, so handlers still hear about a client that disconnects.
    """

    def __init__(self, app, max_bytes: int = DEFAULT_MAX_BODY_BYTES):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":      # a disconnect: let the app see it
                chunks.append(message)
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                return await self._refuse(scope, receive, send)
            chunks.append(message)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(chunks, receive), send)

    async def _refuse(self, scope, receive, send):
        error = APIError(413, f"the request body is larger than the server's limit of {self.max_bytes} bytes "
                              f"(--max-request-body-bytes)", code="request_too_large")
        await error.response()(scope, receive, send)


def _replay(messages: list[dict], receive):
    pending = list(messages)

    async def replayed():
        return pending.pop(0) if pending else await receive()
    return replayed


def api_key_check(api_key: str | None):
    """A FastAPI dependency that wants `Authorization: Bearer <key>` when a key is set."""
    expected = f"Bearer {api_key}".encode() if api_key else None

    async def check(request: Request) -> None:
        if expected is None:
            return
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                           code="invalid_api_key")
    return check
