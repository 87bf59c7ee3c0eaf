"""`x-request-id`: every response carries one, the client's if it sent one, else a generated id.

Clients and proxies match their logs to ours with it (vLLM's `--enable-request-id-headers`), and
the completion ids are built from it (`cmpl-<id>`, `chatcmpl-<id>`). A client's id need not be
unique, so engine request ids get a random part besides (see `RequestId.engine_base`).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from fastapi import Request

from atom_aot.server.protocol.errors import bad_request

HEADER = "x-request-id"
MAX_LENGTH = 128


@dataclass(frozen=True)
class RequestId:
    value: str
    from_client: bool

    def engine_base(self, api_id: str) -> str:
        """A prefix for the engine's request ids that no other call shares."""
        return f"{api_id}.{uuid.uuid4().hex[:8]}" if self.from_client else api_id


class RequestIdHeader:
    """ASGI middleware: decide the call's id, keep it in the request state, send it in the response
    headers. A header that is too long or not printable ASCII is a 400 (with a generated id)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers", [])).get(HEADER.encode())
        given = None if given is None else given.decode("latin-1")
        problem = None if given is None else _problem(given)
        rid = RequestId(given, True) if given is not None and problem is None else RequestId(uuid.uuid4().hex, False)
        scope.setdefault("state", {})["request_id"] = rid
        header = (HEADER.encode(), rid.value.encode("ascii"))

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), header]}
            await send(message)

        if problem is not None:
            error = bad_request(f"{HEADER} header: {problem}", param=HEADER, code="invalid_value")
            return await error.response()(scope, receive, send_with_id)
        await self.app(scope, receive, send_with_id)


def _problem(value: str) -> str | None:
    if not 0 < len(value) <= MAX_LENGTH:
        return f"must be 1 to {MAX_LENGTH} characters, got {len(value)}"
    if not all(0x21 <= ord(c) <= 0x7e for c in value):
        return "must be printable ASCII without spaces"
    return None


def request_id_of(request: Request) -> RequestId:
    return request.state.request_id
