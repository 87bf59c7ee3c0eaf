"""POST /v1/completions: prompts (text or token ids) -> n choices each, whole or streamed.

`echo` + `logprobs` scores the prompt too (the first prompt token has no logprob): this is how
lm-eval's loglikelihood tasks call us (`echo=True, logprobs=1, max_tokens=1`, or `max_tokens=0`,
which the engine serves as 1 generated token that the response leaves out).
Choice i*n + j is choice j of prompt i, as in OpenAI's API.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from atom_aot.runtime.output_processor import RequestOutput
from atom_aot.runtime.outputs import TokenLogprobs
from atom_aot.runtime.tokenizer import encode_prompt
from atom_aot.server.async_engine import RequestGroup
from atom_aot.server.errors import APIError
from atom_aot.server.logprobs import completion_logprobs
from atom_aot.server.protocol import CompletionRequest
from atom_aot.server.request_ids import request_id_of
from atom_aot.server.responses import DONE, Envelope, StreamResponse, envelope, sse, sse_error, usage
from atom_aot.server.serving_common import (ChoiceResult, check_request, check_token_ids, choice_params,
                                            collect_unless_disconnected, submit)
from atom_aot.server.state import ServerState

DEFAULT_MAX_TOKENS = 16      # OpenAI's default for completions


@dataclass
class Prompt:
    token_ids: list[int]
    text: str                # what `echo` shows: the prompt as sent, or its token ids decoded


@dataclass
class NewTokens:
    """What a choice has to show since its last piece: all of it (whole response) or one update."""
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprobs]
    prompt_logprobs: list[TokenLogprobs] | None

    @classmethod
    def of_update(cls, update: RequestOutput) -> "NewTokens":
        return cls(update.delta_text, update.new_token_ids, update.logprobs, update.prompt_logprobs)

    @classmethod
    def of_result(cls, result: ChoiceResult) -> "NewTokens":
        return cls(result.text, result.token_ids, result.logprobs, result.prompt_logprobs)


@dataclass
class Plan:
    """How one completions call maps to engine requests."""
    prompts: list[Prompt]
    n: int
    scoring_only: bool       # max_tokens=0: score the prompt, show no generated token

    def prompt_of(self, choice_index: int) -> Prompt:
        return self.prompts[choice_index // self.n]


async def create_completion(state: ServerState, req: CompletionRequest, request: Request) -> Response:
    arrival = time.perf_counter()
    check_request(state, req, num_prompts=len(req.prompt))
    plan = Plan([_encode(state, p, req.echo) for p in req.prompt], req.n or 1, req.max_tokens == 0)
    prompt_logprobs = req.logprobs if req.echo and req.logprobs is not None else None
    engine_prompts, params = [], []
    for prompt in plan.prompts:
        max_tokens = _max_tokens(state, req, len(prompt.token_ids))
        params += choice_params(state, req, max_tokens, req.logprobs, prompt_logprobs, req.grammar_spec)
        engine_prompts += [prompt.token_ids] * plan.n
    rid = request_id_of(request)
    env = envelope(state, "cmpl", "text_completion", rid, req.include_usage)
    group = await submit(state, rid.engine_base(env.id), engine_prompts, params, arrival)
    if req.stream:
        return StreamResponse(_stream(state, req, plan, group, env), group)
    results = await collect_unless_disconnected(request, group)
    if results is None:
        return Response(status_code=499)        # the client is gone; nobody reads this
    return JSONResponse(_response(state, req, plan, env, results))


def _encode(state: ServerState, prompt: str | list[int], echo: bool) -> Prompt:
    if isinstance(prompt, str):
        return Prompt(encode_prompt(state.tokenizer, prompt), prompt)
    check_token_ids(state, prompt)
    return Prompt(list(prompt), state.tokenizer.decode(prompt) if echo else "")


def _max_tokens(state: ServerState, req: CompletionRequest, num_prompt_tokens: int) -> int:
    """As asked (0 becomes 1: see the module doc); by default 16, capped to what fits the context
    (a prompt that fills it is refused by the engine, with the numbers)."""
    if req.max_tokens is not None:
        return max(1, req.max_tokens)
    return max(1, min(DEFAULT_MAX_TOKENS, state.info.max_model_len - num_prompt_tokens))


def _piece(state: ServerState, req: CompletionRequest, plan: Plan, prompt: Prompt | None, new: NewTokens,
           offset: int) -> tuple[str, dict | None, int]:
    """The text and logprobs a choice shows for `new`; `prompt` is given with a choice's first
    piece only (for echo). Returns them and the text offset after them."""
    text, ids, entries = new.text, list(new.token_ids), list(new.logprobs)
    if plan.scoring_only:
        text, ids, entries = "", [], []
    if prompt is not None and req.echo:
        text = prompt.text + text
        ids = prompt.token_ids + ids
        entries = [None] + list(new.prompt_logprobs or [None] * (len(prompt.token_ids) - 1)) + entries
    if req.logprobs is None:
        return text, None, offset
    shown, offset = completion_logprobs(state.renderer, ids, entries, offset)
    return text, shown, offset


def _finish_reason(plan: Plan, reason: str | None) -> str | None:
    return "length" if plan.scoring_only and reason is not None else reason


def _response(state: ServerState, req: CompletionRequest, plan: Plan, env: Envelope,
              results: list[ChoiceResult]) -> dict:
    choices = []
    for i, r in enumerate(results):
        text, logprobs, _ = _piece(state, req, plan, plan.prompt_of(i), NewTokens.of_result(r), 0)
        choices.append({"index": i, "text": text, "logprobs": logprobs,
                        "finish_reason": _finish_reason(plan, r.finish_reason)})
    return env.wrap(choices, _usage(plan, [r.last for r in results]))


def _usage(plan: Plan, finals: list) -> dict:
    prompt_tokens = sum(len(p.token_ids) for p in plan.prompts)
    completion_tokens = 0 if plan.scoring_only else sum(len(f.token_ids) for f in finals if f is not None)
    cached = sum(f.num_cached_tokens for f in finals[::plan.n] if f is not None)
    return usage(prompt_tokens, completion_tokens, cached, finals)


async def _stream(state: ServerState, req: CompletionRequest, plan: Plan, group: RequestGroup, env: Envelope):
    count = len(group.request_ids)
    offsets, started, finals = [0] * count, [False] * count, [None] * count
    try:
        async for index, update in group:
            prompt = None if started[index] else plan.prompt_of(index)
            started[index] = True
            if update.finished:
                finals[index] = update
            text, logprobs, offsets[index] = _piece(state, req, plan, prompt, NewTokens.of_update(update),
                                                    offsets[index])
            if not (text or update.finished or logprobs and logprobs["tokens"]):
                continue      # text held back (a partial character, a possible stop string)
            yield sse(env.wrap([{"index": index, "text": text, "logprobs": logprobs,
                                 "finish_reason": _finish_reason(plan, update.finish_reason)}]))
        if req.include_usage:
            yield sse(env.wrap([], _usage(plan, finals)))
    except APIError as error:       # the engine died, the server is shutting down, or the reader stalled
        yield sse_error(error)
    yield DONE
