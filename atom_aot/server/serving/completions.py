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

from atom_aot.runtime.outputs import TokenLogprobs
from atom_aot.runtime.text.output_processor import RequestOutput
from atom_aot.server.lifecycle.request_ids import request_id_of
from atom_aot.server.protocol.errors import APIError, bad_request
from atom_aot.server.protocol.requests import CompletionRequest
from atom_aot.server.serving.async_engine import RequestGroup
from atom_aot.server.serving.common import (ChoiceResult, bad_words_of, check_request, check_token_ids,
                                            choice_params, collect_unless_disconnected, renderer_of,
                                            shown_prompt_logprobs, submit, truncated_prompt)
from atom_aot.server.serving.logprobs import completion_logprobs
from atom_aot.server.serving.responses import DONE, Envelope, StreamResponse, envelope, sse, sse_error, usage
from atom_aot.server.serving.tokenizer_pool import off_loop
from atom_aot.server.state import ServerState


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
    prompts = await off_loop(state.tokenize_pool, _encode_all, state, req)
    plan = Plan(prompts, req.n or 1, req.max_tokens == 0)
    asked = [n for n in (req.logprobs if req.echo else None, req.prompt_logprobs) if n is not None]
    prompt_logprobs = max(asked) if asked else None
    bad_words = await bad_words_of(state, req)
    engine_prompts, params = [], []
    for prompt in plan.prompts:
        max_tokens = _max_tokens(state, req, len(prompt.token_ids))
        params += choice_params(req, max_tokens, req.logprobs, prompt_logprobs, req.grammar_spec, bad_words)
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


def _encode_all(state: ServerState, req: CompletionRequest) -> list[Prompt]:
    """Every prompt's token ids (and echo text); runs on the tokenizer pool, off the event loop."""
    encoded = [_encode(state, req, p) for p in req.prompt]
    empty = next((i for i, p in enumerate(encoded) if not p.token_ids), None)
    if empty is not None:
        which = "prompt" if len(req.prompt) == 1 else f"prompt {empty}"
        raise bad_request(f"{which} is empty: it encodes to no tokens; send text or token ids that make at least "
                          f"one token", param="prompt", code="invalid_value")
    return encoded


def _encode(state: ServerState, req: CompletionRequest, prompt: str | list[int]) -> Prompt:
    """A text prompt gets the tokenizer's special tokens unless add_special_tokens=false; a prompt
    truncate_prompt_tokens cuts is echoed as what is left of it."""
    if isinstance(prompt, str):
        ids = state.tokenizer(prompt, add_special_tokens=req.add_special_tokens is not False).input_ids
    else:
        check_token_ids(state, prompt)
        ids = list(prompt)
    kept = truncated_prompt(state, req, ids)
    if isinstance(prompt, str) and len(kept) == len(ids):
        return Prompt(ids, prompt)
    return Prompt(kept, state.tokenizer.decode(kept) if req.echo else "")


def _max_tokens(state: ServerState, req: CompletionRequest, num_prompt_tokens: int) -> int:
    """As asked (0 becomes 1: see the module doc); by default --default-completion-max-tokens (16), capped to
    what fits the context (a prompt that fills it is refused by the engine, with the numbers)."""
    if req.max_tokens is not None:
        return max(1, req.max_tokens)
    return max(1, min(state.options.default_completion_max_tokens, state.info.max_model_len - num_prompt_tokens))


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
    shown, offset = completion_logprobs(renderer_of(state, req), ids, entries, offset)
    return text, shown, offset


def _finish_reason(plan: Plan, reason: str | None) -> str | None:
    return "length" if plan.scoring_only and reason is not None else reason


def _response(state: ServerState, req: CompletionRequest, plan: Plan, env: Envelope,
              results: list[ChoiceResult]) -> dict:
    choices = []
    for i, r in enumerate(results):
        text, logprobs, _ = _piece(state, req, plan, plan.prompt_of(i), NewTokens.of_result(r), 0)
        choices.append({"index": i, "text": text, "logprobs": logprobs,
                        "finish_reason": _finish_reason(plan, r.finish_reason),
                        "stop_reason": r.last.stop_reason if r.last else None,
                        **shown_prompt_logprobs(renderer_of(state, req), req, r)})
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
                                 "finish_reason": _finish_reason(plan, update.finish_reason),
                                 "stop_reason": update.stop_reason}]))
        if req.include_usage:
            yield sse(env.wrap([], _usage(plan, finals)))
    except APIError as error:       # the engine died, the server is shutting down, or the reader stalled
        yield sse_error(error)
    yield DONE
