"""vLLM's tokenizer routes: POST /tokenize, POST /detokenize, GET /tokenizer_info.

Benchmark and eval clients call them to count prompt tokens the way the server does, so
/tokenize takes the same two inputs as the generation endpoints (a prompt, or messages through
the chat template) and encodes them the same way.
"""
from __future__ import annotations

from fastapi import Request

from atom_aot.server.protocol.errors import bad_request
from atom_aot.server.protocol.request_body import parse_json_body, validate
from atom_aot.server.protocol.requests import DetokenizeRequest, TokenizeChatRequest, TokenizeTextRequest
from atom_aot.server.serving.chat import check_request_template, render_messages
from atom_aot.server.serving.common import check_model, check_token_ids
from atom_aot.server.serving.tokenizer_pool import off_loop
from atom_aot.server.state import ServerState

PATH_FIELDS = ("vocab_file", "merges_file", "tokenizer_file")    # where the files were, on the build machine


async def tokenize(state: ServerState, request: Request) -> dict:
    """`{"prompt"}` or `{"messages"}` -> `{"count", "max_model_len", "tokens", "token_strs"}`."""
    body = await _json_body(state, request)
    has_messages = isinstance(body, dict) and "messages" in body
    if has_messages and "prompt" in body:
        raise bad_request("send prompt or messages, not both", param="prompt", code="invalid_value")
    req = validate(TokenizeChatRequest if has_messages else TokenizeTextRequest, body)
    check_model(state, req.model)
    if has_messages:
        check_request_template(state, req)
    return await off_loop(state.tokenize_pool, _tokenized, state, req)


def _tokenized(state: ServerState, req: TokenizeChatRequest | TokenizeTextRequest) -> dict:
    if isinstance(req, TokenizeChatRequest):
        text = render_messages(state, req.messages, req.add_generation_prompt, req.template_tools,
                               req.chat_template_kwargs, req.chat_template, bool(req.continue_final_message))
    else:
        text = req.prompt
    tokens = state.tokenizer(text, add_special_tokens=bool(req.add_special_tokens)).input_ids
    token_strs = state.tokenizer.convert_ids_to_tokens(tokens) if req.return_token_strs else None
    return {"count": len(tokens), "max_model_len": state.info.max_model_len, "tokens": tokens,
            "token_strs": token_strs}


async def detokenize(state: ServerState, request: Request) -> dict:
    """`{"tokens"}` -> `{"prompt"}` (special tokens kept, as vLLM)."""
    req = validate(DetokenizeRequest, await _json_body(state, request))
    check_model(state, req.model)
    check_token_ids(state, req.tokens, param="tokens")
    return {"prompt": await off_loop(state.tokenize_pool, state.tokenizer.decode, req.tokens)}


def tokenizer_info(state: ServerState) -> dict:
    """The tokenizer's config as transformers reads it (tokenizer_config.json with the special-token
    map and chat template files merged in), as vLLM's /tokenizer_info returns it."""
    if state.tokenizer_config is None:
        from atom_aot.artifact.reader import Artifact
        from atom_aot.runtime.text.fast_tokenizer import read_tokenizer_config
        folder = Artifact.open(state.engine.client.artifact_path).member_dir("tokenizer")
        state.tokenizer_config = read_tokenizer_config(folder)
    info = {k: v for k, v in state.tokenizer_config.items() if k not in PATH_FIELDS}
    info.update(state.tokenizer.special_tokens_map)       # the named special tokens, as plain strings
    info["tokenizer_class"] = info.get("tokenizer_class") or type(state.tokenizer).__name__
    info.setdefault("model_max_length", state.info.max_model_len)
    info["chat_template"] = state.tokenizer.chat_template
    return info


async def _json_body(state: ServerState, request: Request):
    return parse_json_body(await request.body(), request.headers.get("content-encoding"),
                           state.options.max_json_depth)
