"""A tokenizer straight from tokenizer.json with the `tokenizers` package, no transformers.

Importing transformers costs about a second on CPU and more on our GPU image, in the thread that
loads the tokenizer beside the model, holding the GIL the model load needs. The engine uses a small
part of transformers' fast tokenizer (`TokenizersBackend`); this class is that part, read from the
same files the way transformers 5 reads them (tests/test_fast_tokenizer.py checks they agree):

- tokenizer.json is the pipeline, post-processor included: transformers ignores
  tokenizer_config.json's `add_bos_token` / `add_eos_token` when tokenizer.json exists.
- tokenizer_config.json names the special tokens (special_tokens_map.json too, but only when the
  config has no `added_tokens_decoder`) and holds the chat template, which chat_template.jinja
  and additional_chat_templates/*.jinja replace.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from tokenizers import AddedToken, Tokenizer

GIL_FREE_ENCODE_CHARS = 1 << 16    # texts this long are encoded without holding the GIL (see encode)
STANDARD_ROLES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")   # the first is what templates read


@dataclass(frozen=True)
class Encoded:
    """What `tokenizer(text)` returns: `.input_ids`, also as `["input_ids"]` like a BatchEncoding."""
    input_ids: list[int]

    def __getitem__(self, key: str):
        return getattr(self, key)


class FastTokenizer:
    """transformers' fast tokenizer as far as atom-aot uses it: call, decode, the vocabulary, the
    special tokens and the chat template, with the same names and results."""

    def __init__(self, backend: Tokenizer, config: dict):
        self.backend = backend
        self.special_tokens_map = _named_special_tokens(config)
        self.extra_special_tokens = _extra_special_tokens(config)
        self.chat_template = config.get("chat_template")
        self.clean_up_tokenization_spaces = _cleans_up_spaces(backend, config)
        backend.no_truncation()     # transformers turns both off for every call that does not ask for them
        backend.no_padding()
        backend.encode_special_tokens = bool(config.get("split_special_tokens", False))
        _add_special_tokens(backend, config, self.special_tokens_map, self.extra_special_tokens)
        for role in STANDARD_ROLES:     # bos_token, bos_token_id, ...: every named token is in the vocabulary now
            token = self.special_tokens_map.get(role)
            setattr(self, role, token)
            setattr(self, f"{role}_id", None if token is None else backend.token_to_id(token))

    @classmethod
    def from_dir(cls, folder: Path) -> FastTokenizer:
        folder = Path(folder)
        return cls(Tokenizer.from_file(str(folder / "tokenizer.json")), read_tokenizer_config(folder))

    # -- encoding and decoding ---------------------------------------------------------------

    def __call__(self, text: str, add_special_tokens: bool = True) -> Encoded:
        return Encoded(self.encode(text, add_special_tokens))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"expected a string to encode, got {type(text).__name__}")
        if len(text) < GIL_FREE_ENCODE_CHARS:
            return self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        # encode holds the GIL for the whole encoding; encode_batch_fast releases it and keeps no offsets (whose
        # freeing, under the GIL, takes a quarter second for a million tokens): a long prompt encoded on a worker
        # thread leaves the server's event loop free. Same tokens: one pipeline.
        return self.backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: int | list[int], skip_special_tokens: bool = False) -> str:
        ids = [ids] if isinstance(ids, int) else list(ids)
        text = self.backend.decode(ids, skip_special_tokens=skip_special_tokens)
        return _clean_up_tokenization(text) if self.clean_up_tokenization_spaces else text

    # -- vocabulary --------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """The base vocabulary, without added tokens (as transformers counts it)."""
        return self.backend.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def convert_ids_to_tokens(self, ids: int | list[int], skip_special_tokens: bool = False):
        if isinstance(ids, int):
            return self.backend.id_to_token(ids)
        skipped = set(self.all_special_ids) if skip_special_tokens else set()
        return [self.backend.id_to_token(int(i)) for i in ids if int(i) not in skipped]

    def convert_tokens_to_ids(self, tokens: str | list[str]):
        if isinstance(tokens, str):
            token_id = self.backend.token_to_id(tokens)
            return self.unk_token_id if token_id is None else token_id
        return [self.convert_tokens_to_ids(t) for t in tokens]

    @property
    def all_special_tokens(self) -> list[str]:
        """Named special tokens, then the extra ones, each once (transformers' order)."""
        return list(dict.fromkeys([*self.special_tokens_map.values(), *self.extra_special_tokens]))

    @property
    def all_special_ids(self) -> list[int]:
        return self.convert_tokens_to_ids(self.all_special_tokens)

    # -- chat --------------------------------------------------------------------------------

    def apply_chat_template(self, conversation: list[dict], tools: list[dict] | None = None,
                            documents: list[dict] | None = None, chat_template: str | None = None,
                            add_generation_prompt: bool = False, continue_final_message: bool = False,
                            tokenize: bool = True, return_dict: bool = True, **template_kwargs):
        """The conversation rendered by the chat template; with `tokenize`, its ids (no special tokens added)."""
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt are not compatible: the first "
                             "continues the last message, the second starts a new one")
        if not conversation:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        template = self._template_named(chat_template, tools)
        if continue_final_message:
            conversation = tag_final_message(conversation, template)
        text = render_chat(template, conversation, tools, documents, add_generation_prompt,
                           {**self.special_tokens_map, **template_kwargs})
        if continue_final_message:
            text = cut_at_final_tag(text)
        if not tokenize:
            return text
        encoded = self(text, add_special_tokens=False)
        return encoded if return_dict else encoded.input_ids

    def _template_named(self, name_or_source: str | None, tools: list[dict] | None) -> str:
        templates = self.chat_template
        if isinstance(templates, dict):
            if name_or_source in templates:
                return templates[name_or_source]
            if name_or_source is None:
                name = "tool_use" if tools is not None and "tool_use" in templates else "default"
                if name not in templates:
                    raise ValueError(f"this tokenizer has several chat templates and no default: {sorted(templates)}")
                return templates[name]
            return name_or_source
        if name_or_source is not None:
            return name_or_source
        if templates is None:
            raise ValueError("this tokenizer has no chat template (tokenizer.chat_template is not set)")
        return templates


# -- reading the folder ------------------------------------------------------------------------

def read_tokenizer_config(folder: Path) -> dict:
    """tokenizer_config.json with what transformers merges into it: the legacy special-token map and
    chat templates kept in their own files."""
    config = _read_json(folder / "tokenizer_config.json")
    _rename_additional_special_tokens(config)
    if "added_tokens_decoder" not in config:
        for key, value in _read_json(folder / "special_tokens_map.json").items():
            if key == "extra_special_tokens" and isinstance(value, list):
                value = list(dict.fromkeys([*config.get("extra_special_tokens", []), *value]))
            config[key] = value
        _rename_additional_special_tokens(config)
    templates = _template_files(folder)
    if list(templates) == ["default"]:
        config["chat_template"] = templates["default"]
    elif templates:
        config["chat_template"] = templates
    if isinstance(config.get("chat_template"), list):     # saved as [{"name": ..., "template": ...}]
        config["chat_template"] = {t["name"]: t["template"] for t in config["chat_template"]}
    return config


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _rename_additional_special_tokens(config: dict) -> None:
    """transformers 5 calls `additional_special_tokens` `extra_special_tokens`."""
    if "additional_special_tokens" in config and not config.get("extra_special_tokens"):
        config["extra_special_tokens"] = config.pop("additional_special_tokens")


def _template_files(folder: Path) -> dict[str, str]:
    templates = {}
    if (folder / "chat_template.jinja").is_file():
        templates["default"] = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    for path in sorted((folder / "additional_chat_templates").glob("*.jinja")):
        templates[path.name.removesuffix(".jinja")] = path.read_text(encoding="utf-8")
    return templates


def _token_text(value) -> str | None:
    """A special token as the config writes it: a string or a serialized AddedToken."""
    return value.get("content") if isinstance(value, dict) else value


def _named_special_tokens(config: dict) -> dict[str, str]:
    """{role: token}: the standard roles, then model-specific ones (`image_token`, ...)."""
    named = {role: _token_text(config.get(role)) for role in STANDARD_ROLES}
    for key, value in config.items():
        if key.endswith("_token") and key not in STANDARD_ROLES and isinstance(_token_text(value), str):
            named[key] = _token_text(value)
    if isinstance(config.get("extra_special_tokens"), dict):
        named.update({key: _token_text(value) for key, value in config["extra_special_tokens"].items()})
    return {role: token for role, token in named.items() if token is not None}


def _extra_special_tokens(config: dict) -> list[str]:
    extra = config.get("extra_special_tokens") or []
    return [] if isinstance(extra, dict) else [_token_text(t) for t in extra]


def _add_special_tokens(backend: Tokenizer, config: dict, named: dict[str, str], extra: list[str]) -> None:
    """What transformers adds on top of tokenizer.json: the config's `added_tokens_decoder` (its flags
    win), and as special tokens the named and extra ones the added vocabulary lacks."""
    from_config = [AddedToken(**{k: v for k, v in token.items() if k != "__type"})
                   for _, token in sorted(config.get("added_tokens_decoder", {}).items(), key=lambda kv: int(kv[0]))]
    for token in from_config:
        if token.content in named.values():
            token.special = True
    present = {t.content for t in backend.get_added_tokens_decoder().values()} | {t.content for t in from_config}
    missing = [AddedToken(t, special=True) for t in dict.fromkeys([*named.values(), *extra]) if t not in present]
    if from_config or missing:
        backend.add_tokens(from_config + missing)


def _cleans_up_spaces(backend: Tokenizer, config: dict) -> bool:
    """transformers skips this WordPiece-era clean-up for BPE models unless forced: it eats real spaces."""
    if not config.get("clean_up_tokenization_spaces", False):
        return False
    return type(backend.model).__name__ != "BPE" or bool(
        config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False))


def _clean_up_tokenization(text: str) -> str:
    for spaced, joined in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                           (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(spaced, joined)
    return text


# -- chat templates ----------------------------------------------------------------------------

def render_chat(template: str, messages: list[dict], tools: list[dict] | None, documents: list[dict] | None,
                add_generation_prompt: bool, variables: dict) -> str:
    """Render as transformers does: messages without None fields, reasoning under all its names,
    everything copied to plain JSON types, tools and documents passed even when None."""
    messages = [_alias_reasoning({k: v for k, v in m.items() if v is not None}) for m in messages]
    return _compiled(template).render(messages=_plain(messages), tools=_plain(tools), documents=_plain(documents),
                                      add_generation_prompt=add_generation_prompt, **_plain(variables))


_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def tag_final_message(conversation: list[dict], template: str) -> list[dict]:
    """transformers' continue_final_message, first half: the last message's text (its last text part)
    marked at its end, so that the rendered chat can be cut there (see cut_at_final_tag)."""
    content = conversation[-1].get("content")
    if content is None:
        raise ValueError('continue_final_message is set but the final message has no "content" to continue!')
    if "content" not in template:
        raise ValueError('continue_final_message is set to "content" but this is not an accepted field in the '
                         'chat_template')
    if isinstance(content, (list, tuple)):
        blocks = [dict(block) for block in content]
        last = next((block for block in reversed(blocks) if "text" in block), None)
        if last is None:
            raise ValueError("continue_final_message is set but we could not find any text to continue in the "
                             "final message!")
        last["text"] += _CONTINUE_TAG
        content = blocks
    else:
        content = content + _CONTINUE_TAG
    return [*conversation[:-1], {**conversation[-1], "content": content}]


def cut_at_final_tag(text: str) -> str:
    """transformers' continue_final_message, second half: the chat up to the end of the last
    message's text; what the template writes after it (an end-of-turn token) goes."""
    tag = _CONTINUE_TAG.strip()
    if tag not in text:
        raise ValueError("continue_final_message is set but the final message does not appear in the chat after "
                         "applying the chat template! This can happen if the chat template deletes portions of the "
                         "final message.")
    at = text.rindex(tag)
    return text[:at] if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()


def _alias_reasoning(message: dict) -> dict:
    reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _plain(value):
    """A copy of JSON types only, so the sandboxed template has no rich object's methods to call."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    for kind in (str, int, float):      # subclasses (enums, ...) back to the base type
        if isinstance(value, kind):
            return kind(value) if kind is not str else str.__str__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return f"<{type(value).__name__}>"


@lru_cache(maxsize=16)
def _compiled(template: str):
    return _jinja_environment().from_string(template)


@lru_cache(maxsize=1)
def _jinja_environment():
    """transformers' chat-template environment: sandboxed, trim_blocks and lstrip_blocks, loop controls,
    its own `tojson`, `raise_exception` and `strftime_now`. jinja2 is imported on first use, not at load."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """`{% generation %}` marks assistant text for training masks; rendering just keeps the text."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_keep"), [], [], body).set_lineno(lineno)

        def _keep(self, caller):
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """jinja's namespace minus underscore names: no reaching CPython internals through it."""
        def __init__(*args, **kwargs):
            self, attrs = args[0], dict(*args[1:], **kwargs)
            for name in attrs:
                _refuse_private(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            _refuse_private(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    def _refuse_private(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set {name!r} on a namespace")

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt),
                       dict=_TemplateDict(), namespace=Namespace)
    return env


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """jinja's own `tojson` escapes HTML characters; chat templates want plain JSON."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _TemplateDict:
    """`dict(...)` and `dict.fromkeys(...)` for templates, without the type itself to poke at."""
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)
