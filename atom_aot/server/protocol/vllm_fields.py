"""vLLM's request fields that shape the prompt and the output text, with vLLM's meanings
(vllm/entrypoints/openai/protocol.py): both endpoints take `VllmTextFields`; the chat endpoint
adds how its messages are rendered (`ChatRenderFields`), which /tokenize shares (`TemplateFields`)."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from atom_aot.server.protocol.base import Strict, Text

INT32_MAX = 2 ** 31 - 1


class VllmTextFields(Strict):
    include_stop_str_in_output: bool | None = None       # the matched stop string stays in the text
    skip_special_tokens: bool | None = None              # special tokens are left out of the text (default)
    # vLLM applies this to slow (Python) tokenizers only; this server loads fast ones, whose text joins
    # special tokens without spaces for either value, as vLLM's fast detokenizer does
    spaces_between_special_tokens: bool | None = True
    truncate_prompt_tokens: Annotated[int, Field(ge=-1, le=INT32_MAX)] | None = None   # keep the last k; -1: context
    return_tokens_as_token_ids: bool | None = False      # logprobs name tokens "token_id:{id}"

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _some_tokens_kept(cls, value):
        if value == 0:
            raise ValueError("must be -1 (the model's context length) or >= 1: the prompt keeps its last k tokens")
        return value

    def truncated(self, token_ids: list[int], max_model_len: int) -> list[int]:
        """The prompt's last truncate_prompt_tokens tokens (all of them without the field)."""
        keep = self.truncate_prompt_tokens
        if keep is None:
            return token_ids
        keep = max_model_len if keep == -1 else keep
        if keep > max_model_len:
            raise ValueError(f"truncate_prompt_tokens ({keep}) is greater than this model's context length "
                             f"({max_model_len})")
        return token_ids[-keep:]


class TemplateFields(Strict):
    """How the chat template renders the messages (chat completions and /tokenize alike)."""
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False     # the last message stays open: the model continues it
    chat_template: Text | None = None               # a Jinja template for this request (--trust-request-chat-template)

    @model_validator(mode="after")
    def _generation_prompt_or_continuation(self):
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true: send "
                             "add_generation_prompt=false to continue the last message")
        return self


class ChatRenderFields(TemplateFields):
    """The template's fields, the tokenizer's special tokens, and what the answer repeats of the messages."""
    add_special_tokens: bool | None = False         # the template writes them; true adds the tokenizer's too
    echo: bool | None = False                       # the answer starts with the last message if it has its role
