"""POST /v1/chat/completions: messages -> chat template -> n choices, whole or streamed."""
from __future__ import annotations

import dataclasses
import time

import jinja2
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from atom_aot.runtime.text.tokenizer import apply_chat_template
from atom_aot.server.lifecycle.request_ids import request_id_of
from atom_aot.server.protocol.errors import APIError, bad_request
from atom_aot.server.protocol.grammar_limits import check_tools
from atom_aot.server.protocol.requests import ChatCompletionRequest, ChatMessage
from atom_aot.server.protocol.vllm_fields import TemplateFields
from atom_aot.server.serving.async_engine import RequestGroup
from atom_aot.server.serving.common import (ChoiceResult, bad_words_of, check_request, choice_params,
                                            collect_unless_disconnected, renderer_of, shown_prompt_logprobs, submit,
                                            truncated_prompt)
from atom_aot.server.serving.harmony_stream import HarmonyFields, HarmonyStream, harmony_fields, harmony_message
from atom_aot.server.serving.logprobs import chat_logprobs
from atom_aot.server.serving.reasoning_parsers import (THINK_TAGS, ReasoningChoiceStream, ReasoningParser,
                                                       reasoning_fields, think_tag_parser)
from atom_aot.server.serving.responses import DONE, Envelope, StreamResponse, envelope, sse, sse_error, usage
from atom_aot.server.serving.tokenizer_pool import off_loop
from atom_aot.server.serving.tool_calls import ToolCallStream, ToolPlan, tool_plan
from atom_aot.server.state import ServerState


async def create_chat_completion(state: ServerState, req: ChatCompletionRequest, request: Request) -> Response:
    arrival = time.perf_counter()
    check_request(state, req)
    check_tools(state.options, req.tools)
    check_request_template(state, req)
    plan = tool_plan(state.options, req, state.tokenizer)
    prompt_ids = await off_loop(state.tokenize_pool, encode_messages, state, req)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    grammar = plan.grammar if plan is not None and plan.grammar is not None else req.grammar_spec
    params = choice_params(req, req.requested_max_tokens, logprobs, req.prompt_logprobs, grammar=grammar,
                           bad_words=await bad_words_of(state, req))
    harmony = harmony_fields(state.options, plan)
    reasoning = reasoning_parser_of(state, req, plan, prompt_ids)
    if (harmony is not None or (reasoning is not None and reasoning.keeps_special_tokens)
            or (plan is not None and plan.keeps_special_tokens)):
        # harmony, and think tags or tool-call markers the tokenizer holds as special tokens, are read from them
        params = [dataclasses.replace(p, skip_special_tokens=False) for p in params]
    rid = request_id_of(request)
    env = envelope(state, "chatcmpl", "chat.completion.chunk" if req.stream else "chat.completion", rid,
                   req.include_usage)
    group = await submit(state, rid.engine_base(env.id), [prompt_ids] * len(params), params, arrival)
    if req.stream:
        return StreamResponse(_stream(state, req, group, env, len(prompt_ids), plan, harmony, reasoning), group)
    results = await collect_unless_disconnected(request, group)
    if results is None:
        return Response(status_code=499)        # the client is gone; nobody reads this
    return JSONResponse(_response(state, req, plan, env, results, len(prompt_ids), harmony, reasoning))


def reasoning_parser_of(state: ServerState, req: ChatCompletionRequest, plan: ToolPlan | None,
                        prompt_ids: list[int]) -> ReasoningParser | None:
    """How the server's think-tag `--reasoning-parser` reads this request's output; None where none does: no such
    parser (openai_gptoss is read as harmony), or a tool_choice's grammar writes the output (plain JSON)."""
    name = state.options.reasoning_parser
    if name not in THINK_TAGS or (plan is not None and plan.grammar is not None):
        return None
    return think_tag_parser(name, state.tokenizer, req.chat_template_kwargs, prompt_ids,
                            constrained=req.grammar_spec is not None, skip_special_tokens=req.skip_special_tokens,
                            tool_markers=plan.kept_markers if plan is not None else ())


def check_request_template(state: ServerState, req: TemplateFields) -> None:
    """A request's own chat template is a program the server runs: only where its operator allows (as vLLM)."""
    if req.chat_template is not None and not state.options.trust_request_chat_template:
        raise bad_request("chat_template: this server renders messages with its model's chat template only; its "
                          "operator can let requests bring their own with --trust-request-chat-template",
                          param="chat_template", code="unsupported_parameter")


def encode_messages(state: ServerState, req: ChatCompletionRequest) -> list[int]:
    """The prompt's token ids: the rendered messages, the tokenizer's special tokens only if asked
    (the template writes its own), truncated as asked."""
    text = render_messages(state, req.messages, req.add_generation_prompt, req.template_tools,
                           req.chat_template_kwargs, req.chat_template, bool(req.continue_final_message))
    ids = state.tokenizer(text, add_special_tokens=bool(req.add_special_tokens)).input_ids
    return truncated_prompt(state, req, ids)


def render_messages(state: ServerState, messages: list[ChatMessage], add_generation_prompt: bool | None,
                    tools: list[dict] | None = None, template_kwargs: dict | None = None,
                    chat_template: str | None = None, continue_final_message: bool = False) -> str:
    """The chat template's text for `messages`, `tools` and the request's template variables (a
    template error is the client's 400); `chat_template` replaces the model's."""
    options = {**(template_kwargs or {}), **({"tools": tools} if tools else {}),
               **({"chat_template": chat_template} if chat_template is not None else {}),
               **({"continue_final_message": True} if continue_final_message else {})}
    try:
        return apply_chat_template(state.tokenizer, [m.as_template_input() for m in messages],
                                   add_generation_prompt=add_generation_prompt is not False, **options)
    except (ValueError, jinja2.TemplateError) as e:
        raise bad_request(f"the chat template could not render these messages: {str(e)[:500]}", param="messages",
                          code="invalid_value") from None


def _message(plan: ToolPlan | None, result: ChoiceResult, harmony: HarmonyFields | None,
             reasoning: ReasoningParser | None) -> tuple[dict, str | None]:
    """The assistant message of a choice and its finish reason: the reasoning (harmony's, or a think-tag parser's)
    and tool calls read from the text; with a think-tag parser the calls are read from the content only."""
    if harmony is not None:
        message, parsed = harmony_message(harmony, result.text)
        return message, plan.finish_reason(parsed, result.finish_reason) if plan else result.finish_reason
    text, thought = result.text, {}
    if reasoning is not None:
        thinking, text = reasoning.split(result.text)
        thought = reasoning_fields(thinking)
    if plan is None or text is None:
        return {"role": "assistant", "content": text, **thought}, result.finish_reason
    parsed = plan.parse(text)
    message = {"role": "assistant", "content": parsed.content, **thought}
    if parsed.tool_calls:
        message["tool_calls"] = [call.as_openai() for call in parsed.tool_calls]
    return message, plan.finish_reason(parsed, result.finish_reason)


def _response(state: ServerState, req: ChatCompletionRequest, plan: ToolPlan | None, env: Envelope,
              results: list[ChoiceResult], num_prompt_tokens: int, harmony: HarmonyFields | None = None,
              reasoning: ReasoningParser | None = None) -> dict:
    choices, echo, renderer = [], echoed(req), renderer_of(state, req)
    for i, r in enumerate(results):
        message, finish_reason = _message(plan, r, harmony, reasoning)
        if echo:
            message["content"] = echo + (message["content"] or "")
        choices.append({"index": i, "message": message, "finish_reason": finish_reason,
                        "stop_reason": r.last.stop_reason if r.last else None,
                        "logprobs": chat_logprobs(renderer, r.logprobs) if req.logprobs else None,
                        **shown_prompt_logprobs(renderer, req, r)})
    completion_tokens = sum(len(r.token_ids) for r in results)
    cached = max((r.last.num_cached_tokens for r in results if r.last), default=0)
    return env.wrap(choices, usage(num_prompt_tokens, completion_tokens, cached, [r.last for r in results]))


async def _stream(state: ServerState, req: ChatCompletionRequest, group: RequestGroup, env: Envelope,
                  num_prompt_tokens: int, plan: ToolPlan | None = None, harmony: HarmonyFields | None = None,
                  reasoning: ReasoningParser | None = None):
    """The `{"role": "assistant"}` chunks are sent with the engine's first output, not before the
    prefill: benchmark clients (vLLM's, ATOM's) start the first-token clock on the first chunk."""
    finals = [None] * len(group.request_ids)
    tool_streams = [_choice_stream(plan, harmony, reasoning) for _ in group.request_ids]
    roles = "".join(_first_chunks(env, len(group.request_ids), echoed(req)))
    renderer = renderer_of(state, req)
    try:
        async for index, update in group:
            head, roles = roles, ""     # the role chunks go with the first output, in the same write
            if update.finished:
                finals[index] = update
            delta, finish_reason = _delta(tool_streams[index], update)
            if not (delta or update.finished or (req.logprobs and update.logprobs)):
                if head:
                    yield head
                continue      # text held back (a partial character, a possible stop string or tool call)
            choice = {"index": index, "delta": delta, "finish_reason": finish_reason, "stop_reason": update.stop_reason,
                      "logprobs": chat_logprobs(renderer, update.logprobs) if req.logprobs else None}
            yield head + sse(env.wrap([choice]))
        if req.include_usage:
            completion_tokens = sum(len(f.token_ids) for f in finals)
            cached = max(f.num_cached_tokens for f in finals)
            yield sse(env.wrap([], usage(num_prompt_tokens, completion_tokens, cached, finals)))
    except APIError as error:       # the engine died, the server is shutting down, or the reader stalled
        yield sse_error(error)
    yield DONE


def echoed(req: ChatCompletionRequest) -> str:
    """vLLM's chat echo: the answer starts with the last message's content when that message has the
    answer's role (assistant; with add_generation_prompt=false, the last message's own)."""
    last = req.messages[-1]
    if not req.echo or (req.add_generation_prompt is not False and last.role != "assistant"):
        return ""
    content = last.content
    return "\n".join(part.text for part in content) if isinstance(content, list) else content or ""


def _first_chunks(env: Envelope, count: int, echo: str):
    """Each choice's role chunk, and its echo of the last message when asked."""
    for i in range(count):
        yield sse(env.wrap([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}]))
        if echo:
            yield sse(env.wrap([{"index": i, "delta": {"content": echo}, "logprobs": None, "finish_reason": None}]))


ChoiceStream = ToolCallStream | HarmonyStream | ReasoningChoiceStream


def _choice_stream(plan: ToolPlan | None, harmony: HarmonyFields | None,
                   reasoning: ReasoningParser | None) -> ChoiceStream | None:
    """What reads one choice's stream: harmony, or the reasoning parser with the tool calls read from its content,
    or the tool calls alone; None: the text is the content."""
    if harmony is not None:
        return HarmonyStream(harmony, plan)
    tools = ToolCallStream(plan) if plan is not None else None
    return ReasoningChoiceStream(reasoning.stream(), tools) if reasoning is not None else tools


def _delta(tool_stream: ChoiceStream | None, update) -> tuple[dict, str | None]:
    """A stream chunk's delta and finish reason: the text as content, or through the choice's tool, harmony or
    reasoning stream."""
    if tool_stream is None:
        return ({"content": update.delta_text} if update.delta_text else {}), update.finish_reason
    delta = tool_stream.delta(update.delta_text, update.finished)
    return delta, tool_stream.finish_reason(update.finish_reason) if update.finished else None
