"""Response framing the chat and completions handlers share: the repeated envelope fields,
usage with timings, SSE events, and a stream response that cleans up after itself."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

from fastapi.responses import StreamingResponse

from atom_aot.runtime.text.output_processor import RequestOutput
from atom_aot.server.lifecycle.request_ids import RequestId
from atom_aot.server.protocol.errors import APIError
from atom_aot.server.serving.async_engine import RequestGroup
from atom_aot.server.state import ServerState

DONE = "data: [DONE]\n\n"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int, finals: list[RequestOutput | None]) -> dict:
    """OpenAI's usage plus timings: ttft_s (first choice to start), tpot_s (mean over choices),
    latency_s (last choice to end)."""
    finals = [f for f in finals if f is not None]
    ttfts = [f.ttft for f in finals if f.ttft is not None]
    tpots = [f.tpot for f in finals if f.tpot is not None]
    latencies = [f.latency for f in finals if f.latency is not None]
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
            "ttft_s": min(ttfts) if ttfts else None, "tpot_s": sum(tpots) / len(tpots) if tpots else None,
            "latency_s": max(latencies) if latencies else None}


@dataclass
class Envelope:
    """The fields every response object and stream chunk of one API call repeats."""
    id: str
    object: str
    created: int
    model: str
    system_fingerprint: str
    include_usage: bool = False      # streams: every chunk carries "usage" (null but the last)

    def wrap(self, choices: list[dict], usage: dict | None = None) -> dict:
        body = {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                "system_fingerprint": self.system_fingerprint, "choices": choices}
        if usage is not None or self.include_usage:
            body["usage"] = usage
        return body


def envelope(state: ServerState, prefix: str, kind: str, request_id: RequestId,
             include_usage: bool = False) -> Envelope:
    """The id is `<prefix>-<x-request-id>`, the client's id or a generated one."""
    return Envelope(f"{prefix}-{request_id.value}", kind, int(time.time()), state.model_name,
                    f"atom-{state.info.build_key[:12]}", include_usage)


class StreamResponse(StreamingResponse):
    """SSE whose engine requests are aborted however the response ends, even if its body was
    never started (a client gone before the first chunk)."""

    def __init__(self, body, group: RequestGroup):
        super().__init__(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.group = group

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.group.close()


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def sse_error(error: APIError) -> str:
    return sse(error.body())
