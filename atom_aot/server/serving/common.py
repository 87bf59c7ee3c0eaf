"""The request side the chat and completions handlers share: checks against the loaded model,
per-choice SamplingParams, submitting to the engine, collecting results, noticing a client leave."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fastapi import Request

from atom_aot.runtime.outputs import TokenLogprobs
from atom_aot.runtime.processes.client import CallRejected, EngineDeadError
from atom_aot.runtime.sampling_params import GrammarSpec, SamplingParams
from atom_aot.runtime.text.output_processor import RequestOutput
from atom_aot.server.options import ServerOptions, flag_of
from atom_aot.server.protocol.errors import MAX_SHOWN_INPUT_CHARS, APIError, bad_request, engine_unavailable, shutting_down
from atom_aot.server.protocol.grammar_limits import check_structured_output
from atom_aot.server.protocol.requests import SamplingFields
from atom_aot.server.serving.async_engine import RequestGroup
from atom_aot.server.serving.logprobs import TokenIdRenderer, TokenRenderer, prompt_logprobs
from atom_aot.server.serving.tokenizer_pool import off_loop
from atom_aot.server.state import ServerState


def check_request(state: ServerState, req: SamplingFields, num_prompts: int = 1) -> None:
    """What does not depend on the prompts' text: the server's state and limits, the model name
    (none means the served model)."""
    if state.draining:
        raise shutting_down()
    if state.engine.dead:
        raise engine_unavailable()
    check_model(state, req.model)
    check_limits(state.options, num_prompts, req.n or 1)
    check_token_ids(state, req.stop_token_ids or [], param="stop_token_ids")
    check_token_ids(state, list(req.token_bias), param="logit_bias")
    check_token_ids(state, req.allowed_token_ids or [], param="allowed_token_ids")


def check_model(state: ServerState, model: str | None) -> None:
    """None (the field left out) means the served model, as in vLLM."""
    if model is not None and model != state.model_name:
        raise bad_request(f"model {model[:MAX_SHOWN_INPUT_CHARS]!r} is not served here; this server serves "
                          f"{state.model_name!r} (see GET /v1/models)", param="model", code="model_not_found")


def check_limits(options: ServerOptions, num_prompts: int, n: int) -> None:
    if num_prompts > options.max_prompts_per_request:
        raise _over_limit(f"this request has {num_prompts} prompts", options.max_prompts_per_request,
                          "max_prompts_per_request", "prompt")
    if n > options.max_n:
        raise _over_limit(f"n is {n}", options.max_n, "max_n", "n")
    if num_prompts * n > options.max_seqs_per_request:
        raise _over_limit(f"this request starts {num_prompts} x {n} = {num_prompts * n} sequences (prompts x n)",
                          options.max_seqs_per_request, "max_seqs_per_request", "n")


def _over_limit(what: str, limit: int, option: str, param: str) -> APIError:
    return bad_request(f"{what}, over this server's limit of {limit} ({flag_of(option)} raises it)", param=param,
                       code="limit_exceeded")


def check_token_ids(state: ServerState, token_ids: list[int], param: str = "prompt") -> None:
    vocab = state.info.vocab_size
    bad = next((t for t in token_ids if t >= vocab), None)
    if bad is not None:
        raise bad_request(f"token id {bad} is outside the vocabulary (0..{vocab - 1})", param=param,
                          code="invalid_value")


async def bad_words_of(state: ServerState, req: SamplingFields) -> list[list[int]]:
    """The request's bad words as token-id sequences, tokenized off the event loop."""
    if not req.bad_words:
        return []
    return await off_loop(state.tokenize_pool, bad_words_token_ids, state.tokenizer, req.bad_words)


def check_context(state: ServerState, num_prompt_tokens: int, max_tokens: int | None) -> None:
    """The engine's context check (runtime/engine_core.check_prompt), made here too so that a prompt of
    megabytes is refused before its token ids are sent to the engine."""
    wanted = num_prompt_tokens + (max_tokens or 1)
    if wanted > state.info.max_model_len:
        raise bad_request(f"this model's maximum context length is {state.info.max_model_len} tokens, but the "
                          f"request needs {wanted} ({num_prompt_tokens} in the prompt + {max_tokens or 1} to "
                          f"generate)", param="max_tokens" if max_tokens else "prompt",
                          code="context_length_exceeded")


def renderer_of(state: ServerState, req: SamplingFields) -> TokenRenderer | TokenIdRenderer:
    """How the request's logprobs name tokens: by their text, or as "token_id:{id}" when asked."""
    return TokenIdRenderer() if req.return_tokens_as_token_ids else state.renderer


def shown_prompt_logprobs(renderer: TokenRenderer | TokenIdRenderer, req: SamplingFields,
                          result: ChoiceResult) -> dict:
    """A choice's `prompt_logprobs` field (vLLM's format) when the request asked for it, else nothing."""
    if req.prompt_logprobs is None:
        return {}
    return {"prompt_logprobs": prompt_logprobs(renderer, result.prompt_logprobs or [])}


def truncated_prompt(state: ServerState, req: SamplingFields, token_ids: list[int]) -> list[int]:
    """The prompt as the request's truncate_prompt_tokens keeps it (vLLM's meaning: its last k tokens)."""
    try:
        return req.truncated(token_ids, state.info.max_model_len)
    except ValueError as e:
        raise bad_request(str(e), param="truncate_prompt_tokens", code="invalid_value") from None


def bad_words_token_ids(tokenizer, words: list[str]) -> list[list[int]]:
    """vLLM's tokenization of bad words: each word as it starts the text and, when that differs in
    its first token, as it follows a space."""
    token_ids = []
    for word in words:
        alone = tokenizer(word.lstrip(), add_special_tokens=False).input_ids
        spaced = tokenizer(" " + word.lstrip(), add_special_tokens=False).input_ids
        token_ids += [ids for ids in (alone, spaced if spaced[:1] != alone[:1] and len(spaced) == len(alone) else [])
                      if ids]
    return token_ids


def choice_params(req: SamplingFields, max_tokens: int | None, logprobs: int | None,
                  prompt_logprobs: int | None = None, grammar: GrammarSpec | None = None,
                  bad_words: list[list[int]] = ()) -> list[SamplingParams]:
    """One SamplingParams per choice; with a seed, choice i uses seed + i (reproducible, distinct: an
    int64 seed plus a choice index fits what a torch generator takes). The request's fields go over as given: a
    field the client left out takes SamplingParams' default (the defaults live there, once), and SamplingParams
    checks the values its own rules cover (its complaint is a 400 naming the field)."""
    given = dict(temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
                 ignore_eos=req.ignore_eos, presence_penalty=req.presence_penalty,
                 frequency_penalty=req.frequency_penalty, repetition_penalty=req.repetition_penalty,
                 min_tokens=req.min_tokens, allowed_token_ids=req.allowed_token_ids, cache_salt=req.cache_salt,
                 priority=req.priority, include_stop_str_in_output=req.include_stop_str_in_output,
                 skip_special_tokens=req.skip_special_tokens)
    fields = {name: value for name, value in given.items() if value is not None}
    fields.update(max_tokens=max_tokens, stop_strings=req.stop_strings, stop_token_ids=list(req.stop_token_ids or []),
                  logprobs=logprobs, prompt_logprobs=prompt_logprobs, logit_bias=req.token_bias,
                  bad_words_token_ids=list(bad_words), grammar=grammar)
    params = []
    for i in range(req.n or 1):
        try:
            params.append(SamplingParams(**fields, seed=None if req.seed is None else req.seed + i))
        except ValueError as e:
            raise bad_request(str(e), param=_param_named(str(e)), code="invalid_value") from None
    return params


def _param_named(message: str) -> str | None:
    """The field a SamplingParams complaint is about: the field its message starts with."""
    name = message.split(" ", 1)[0]
    return name if name in SamplingParams.__dataclass_fields__ else None


async def submit(state: ServerState, api_id: str, prompts: list[list[int]], params: list[SamplingParams],
                 arrival_time: float) -> RequestGroup:
    """Queue one engine request per (prompt, choice); the engine's refusal becomes a 400 (a full
    engine a 429, a server shutting down a 503)."""
    for grammar in {choice.grammar for choice in params}:      # before anything compiles
        check_structured_output(state.options, grammar)
    for prompt, choice in zip(prompts, params):
        check_context(state, len(prompt), choice.max_tokens)
    ids = [f"{api_id}-{i}" for i in range(len(prompts))]
    try:
        return await state.engine.submit(ids, prompts, params, arrival_time)
    except CallRejected as e:
        raise bad_request(str(e), code=e.code or "invalid_value") from None
    except EngineDeadError:
        raise engine_unavailable() from None


@dataclass
class ChoiceResult:
    """Everything one choice produced, gathered from its updates (each update carries the whole text
    and token list so far, so those are read from the last one, once)."""
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None
    last: RequestOutput | None = None

    @property
    def text(self) -> str:
        return self.last.text if self.last is not None else ""

    @property
    def token_ids(self) -> list[int]:
        return self.last.token_ids if self.last is not None else []

    def add(self, update: RequestOutput) -> None:
        self.last = update
        self.logprobs.extend(update.logprobs)
        if update.prompt_logprobs is not None:
            self.prompt_logprobs = update.prompt_logprobs
        self.finish_reason = update.finish_reason


async def collect(group: RequestGroup) -> list[ChoiceResult]:
    """Every choice's result (raises the group's APIError if it was stopped)."""
    results = [ChoiceResult() for _ in group.request_ids]
    async for index, update in group:
        results[index].add(update)
    return results


async def collect_unless_disconnected(request: Request, group: RequestGroup) -> list[ChoiceResult] | None:
    """All choices' results, or None if the client left first; either way nothing is left running."""
    try:
        return await unless_disconnected(request, collect(group))
    finally:
        group.close()


async def unless_disconnected(request: Request, work):
    """Run `work` (a coroutine) but cancel it if the client hangs up first. Returns its result,
    or None after a disconnect."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    return None


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
