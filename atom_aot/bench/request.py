"""One streamed request to an OpenAI-compatible endpoint, timed on the client as vLLM's
`backend_request_func.py` times it: TTFT at the first chunk that carries output, an ITL sample
between successive output chunks, E2EL at the end of the stream. Token counts come from the
server's `usage` (`stream_options.include_usage`), not from re-tokenizing the text.

The streams go through aiohttp, as vLLM's and SGLang's clients do: httpx's stream iteration costs
the client enough CPU under a few hundred streams to inflate the TTFT it reports (docs/benchmarking.md).
Plain requests (profiling, GSM8K) stay on httpx.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field

import aiohttp
import httpx

TIMEOUT_S = 6 * 60 * 60      # a long benchmark queue must not time out on the client


@dataclass
class RequestInput:
    prompt: str
    api_url: str
    prompt_len: int
    output_len: int
    model: str
    ignore_eos: bool = False
    chat: bool = False           # /v1/chat/completions: the prompt is one user message


@dataclass
class RequestOutput:
    success: bool = False
    generated_text: str = ""
    prompt_len: int = 0
    output_tokens: int | None = None          # usage.completion_tokens
    server_prompt_tokens: int | None = None   # usage.prompt_tokens (chat: after the template)
    ttft: float = 0.0                         # seconds
    latency: float = 0.0                      # seconds, request sent -> stream done (E2EL)
    itl: list[float] = field(default_factory=list)
    error: str = ""


def auth_headers() -> dict:
    key = os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def make_client() -> httpx.AsyncClient:
    """One client for the whole run, with no cap on connections (a cap would silently limit
    concurrency; --max-concurrency is the knob for that)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(timeout=httpx.Timeout(TIMEOUT_S), limits=limits, headers=auth_headers())


def make_stream_session() -> aiohttp.ClientSession:
    """One session for the run's streamed requests, with no cap on connections (a cap would
    silently limit concurrency; --max-concurrency is the knob for that)."""
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S),
                                 connector=aiohttp.TCPConnector(limit=0), headers=auth_headers())


def payload(req: RequestInput) -> dict:
    body = {"model": req.model, "temperature": 0.0, "max_tokens": req.output_len, "stream": True,
            "stream_options": {"include_usage": True}}
    if req.ignore_eos:
        body["ignore_eos"] = True
    if req.chat:
        body["messages"] = [{"role": "user", "content": req.prompt}]
    else:
        body["prompt"] = req.prompt
    return body


async def send_request(session: aiohttp.ClientSession, req: RequestInput) -> RequestOutput:
    out = RequestOutput(prompt_len=req.prompt_len)
    start = time.perf_counter()
    last = start
    try:
        async with session.post(req.api_url, json=payload(req)) as response:
            if response.status != 200:
                out.error = f"HTTP {response.status}: {(await response.read()).decode(errors='replace')}"
                return out
            async for data in _sse_data(response):
                now = time.perf_counter()
                text = _chunk_text(data, req.chat)
                if text is not None:
                    if out.ttft == 0.0:
                        out.ttft = now - start
                    else:
                        out.itl.append(now - last)
                    last = now
                    out.generated_text += text
                if data.get("usage"):
                    out.output_tokens = data["usage"].get("completion_tokens")
                    out.server_prompt_tokens = data["usage"].get("prompt_tokens")
        out.latency = time.perf_counter() - start
        out.success = out.ttft > 0.0 or out.output_tokens == 0
        if not out.success:
            out.error = "the stream ended without output"
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as e:
        out.error = f"{type(e).__name__}: {e}"
    return out


async def _sse_data(response: aiohttp.ClientResponse):
    """The JSON payloads of an SSE stream, up to `data: [DONE]`; an error event raises. Lines are
    cut from the raw bytes as they come (a network read may hold several events or part of one)."""
    pending = b""
    async for chunk in response.content.iter_any():
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            data = line[len(b"data:"):].strip()
            if data == b"[DONE]":
                return
            event = json.loads(data)
            if "error" in event:
                raise ValueError(f"the server sent an error event: {event['error']}")
            yield event


def _chunk_text(data: dict, chat: bool) -> str | None:
    """The output a chunk carries, or None for chunks that carry none (a chat stream's opening
    role delta, the usage chunk): those must not count as the first token."""
    choices = data.get("choices") or []
    if not choices:
        return None
    choice = choices[0]
    text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
    if text or choice.get("finish_reason"):
        return text or ""
    return None
