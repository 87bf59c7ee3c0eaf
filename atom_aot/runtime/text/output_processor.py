"""From token ids to what a caller sees: incremental text, stop strings, timings.

Runs beside the tokenizer: in the offline engine, and in the HTTP front end when serving; both
go through `OutputProcessor.process`, the one place where stop strings end requests. A stop
string finishes the request here and, if the engine core is still running it, aborts it there
(through the `abort_in_core` the engine hands in). While a request is running, the last few
characters are held back so a stop string is never half-streamed.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable

from atom_aot.runtime.outputs import CoreOutput, TokenLogprobs
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.runtime.text.detokenizer import ByteStream, Detokenizer, WindowStream


@dataclass
class RequestOutput:
    request_id: str
    text: str                          # the whole output text so far (stop string trimmed unless asked to stay)
    delta_text: str                    # the text this update adds
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    num_tokens_input: int
    num_tokens_output: int             # output tokens so far
    logprobs: list[TokenLogprobs] = field(default_factory=list)   # for new_token_ids
    prompt_logprobs: list[TokenLogprobs] | None = None
    num_cached_tokens: int = 0
    ttft: float | None = None          # seconds from arrival to the first token
    tpot: float | None = None          # mean seconds per output token after the first
    latency: float | None = None       # seconds from arrival to the end
    # vLLM's stop_reason: the stop string or the id of the stop token (one of stop_token_ids) that finished it;
    # None at an EOS, at the length or while it runs
    stop_reason: str | int | None = None
    # the request's output tokens, a list later updates extend: `token_ids` reads this update's share
    all_token_ids: list[int] = field(default_factory=list, repr=False, compare=False)

    @property
    def token_ids(self) -> list[int]:
        """Every output token so far (a new list on each read: most updates are never asked)."""
        return self.all_token_ids[:self.num_tokens_output]

    def as_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "latency": self.latency,
                "finish_reason": self.finish_reason, "num_tokens_input": self.num_tokens_input,
                "num_tokens_output": self.num_tokens_output, "ttft": self.ttft, "tpot": self.tpot,
                "stop_reason": self.stop_reason}


StreamCallback = Callable[[RequestOutput], None]
AbortInCore = Callable[[list[str]], None]    # request ids a stop string finished while the core runs them


class _RequestState:
    __slots__ = ("stream", "params", "callback", "text", "emitted", "token_ids", "holdback", "stops_from", "stop_reason")

    def __init__(self, stream: ByteStream | WindowStream, params: SamplingParams, callback: StreamCallback | None):
        self.stream = stream
        self.params = params
        self.callback = callback
        self.text = ""
        self.emitted = 0   # characters of text already handed out
        self.token_ids: list[int] = []
        self.holdback = max((len(s) for s in params.stop_strings), default=1) - 1
        self.stops_from = 0  # where stop strings are looked for: past the text of the first min_tokens tokens
        self.stop_reason: str | int | None = None


class OutputProcessor:
    def __init__(self, tokenizer, abort_in_core: AbortInCore):
        self.tokenizer = tokenizer
        self.detokenizer = Detokenizer(tokenizer)
        self.abort_in_core = abort_in_core
        self.requests: dict[str, _RequestState] = {}

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams,
                    callback: StreamCallback | None = None) -> None:
        stream = self.detokenizer.stream(prompt_ids, params.skip_special_tokens)
        self.requests[request_id] = _RequestState(stream, params, callback)

    def abort(self, request_id: str) -> None:
        self.requests.pop(request_id, None)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def process(self, outputs: list[CoreOutput]) -> list[RequestOutput]:
        """The updates of the requests these outputs advanced. A stop string in the text ends the
        request with finish_reason "stop" even when the core finished it on the same token (at
        max_tokens, say); one the core still runs is aborted there. The token that finished a request (an EOS or a
        stop token) stays in its token ids and leaves the text, unless include_stop_str_in_output (vLLM's rule)."""
        updates, stopped = [], []
        for out in outputs:
            state = self.requests.get(out.request_id)
            if state is None:          # aborted meanwhile
                continue
            finish_reason = out.finish_reason
            if out.stop_token_id is not None and out.stop_token_id in state.params.stop_token_ids:
                state.stop_reason = out.stop_token_id
            untexted = bool(out.stop_token_id is not None and out.new_token_ids
                            and not state.params.include_stop_str_in_output)
            kept, matched = self._add_tokens(state, out.new_token_ids, untexted)
            if kept < len(out.new_token_ids):
                out = dataclasses.replace(out, new_token_ids=out.new_token_ids[:kept], logprobs=out.logprobs[:kept])
            if matched:
                if finish_reason is None:
                    stopped.append(out.request_id)
                finish_reason = "stop"
            update = self._update(state, out, finish_reason)
            if update.finished:
                del self.requests[out.request_id]
            if state.callback is not None:
                state.callback(update)
            updates.append(update)
        if stopped:
            self.abort_in_core(stopped)
        return updates

    def _add_tokens(self, state: _RequestState, token_ids: list[int], last_untexted: bool) -> tuple[int, bool]:
        """Add the tokens to the text; with stop strings one at a time, up to the first that
        completes one (a verified run of speculative decoding brings several). `last_untexted`: the last token
        joins the token ids only (the stop token that finished the request). Returns (tokens kept, whether a stop
        string matched)."""
        texted = len(token_ids) - last_untexted
        if not state.params.stop_strings:
            state.token_ids += token_ids
            state.text += state.stream.add(token_ids[:texted])
            return len(token_ids), False
        min_tokens = state.params.min_tokens
        for kept, token in enumerate(token_ids, 1):
            state.token_ids.append(token)
            if kept > texted:
                return kept, False
            state.text += state.stream.add([token])
            if len(state.token_ids) == min_tokens:      # vLLM's rule: no stop string ends the first min_tokens
                state.stops_from = max(0, len(state.text) - state.holdback)
            if len(state.token_ids) > min_tokens and self._match_stop_string(state):
                return kept, True
        return len(token_ids), False

    def _match_stop_string(self, state: _RequestState) -> bool:
        search_from = max(state.stops_from, state.emitted - state.holdback)
        hits = [(i, len(s)) for i, s in ((state.text.find(s, search_from), s) for s in state.params.stop_strings)
                if i >= 0]
        if hits:
            start, length = min(hits)
            state.stop_reason = state.text[start:start + length]
            state.text = state.text[:start + length if state.params.include_stop_str_in_output else start]
        return bool(hits)

    def _update(self, state: _RequestState, out: CoreOutput, finish_reason: str | None) -> RequestOutput:
        finished = finish_reason is not None
        visible = len(state.text) if finished else max(state.emitted, len(state.text) - state.holdback)
        delta, state.emitted = state.text[state.emitted:visible], visible
        update = RequestOutput(
            request_id=out.request_id, text=state.text[:visible], delta_text=delta, new_token_ids=out.new_token_ids,
            finished=finished, finish_reason=finish_reason, num_tokens_input=out.num_prompt_tokens,
            num_tokens_output=len(state.token_ids), logprobs=out.logprobs, prompt_logprobs=out.prompt_logprobs,
            num_cached_tokens=out.num_cached_tokens, all_token_ids=state.token_ids,
            stop_reason=state.stop_reason if finished else None)
        if out.first_token_time is not None:
            update.ttft = out.first_token_time - out.arrival_time
        if finished:
            end = out.finish_time or time.perf_counter()
            update.latency = end - out.arrival_time
            n = len(state.token_ids)
            update.tpot = (end - out.first_token_time) / (n - 1) if n > 1 and out.first_token_time else 0.0
        return update
