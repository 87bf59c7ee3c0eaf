"""OpenAI's bookkeeping fields, which clients (the openai SDK, litellm, langchain) send with every
request: they tag, route or store a request on OpenAI's side and ask nothing of the model.

A self-hosted server has none of that machinery, so each is accepted with no effect on the output
(docs/server.md says so field by field), except the values that ask for something this server
cannot do, which are refused by name: `store: true` (there are no stored completions to keep),
a `service_tier` other than auto/default (there is one tier),
a `verbosity` other than OpenAI's default, medium (it asks a reasoning model for shorter or longer
answers; no model here is steered that way).
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from atom_aot.server.protocol.base import Strict, Text, refusal

MAX_METADATA_PAIRS = 16          # OpenAI's limits on metadata
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
Tag = Annotated[Text, Field(max_length=512)]


class BookkeepingFields(Strict):
    """Accepted by both endpoints; see the module doc for what each one does here (nothing)."""
    store: bool | None = None
    metadata: dict[Text, Text] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    user: Tag | None = None
    prompt_cache_key: Tag | None = None
    safety_identifier: Tag | None = None
    verbosity: Literal["low", "medium", "high"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _nothing_asked_that_is_not_here(cls, data):
        if not isinstance(data, dict):
            return data
        if data.get("store") is True:
            raise refusal("store", "unsupported_parameter", "store: true asks the server to keep this completion "
                          "for later retrieval; this server keeps no stored completions (send false or leave it out)")
        tier = data.get("service_tier")
        if isinstance(tier, str) and tier in ("flex", "scale", "priority"):
            raise refusal("service_tier", "unsupported_parameter", f"service_tier {tier!r} asks for another "
                          f"processing tier; this server has one: send 'auto' or 'default' (the priority field orders "
                          f"requests where the server runs --scheduling-policy priority)")
        verbosity = data.get("verbosity")
        if isinstance(verbosity, str) and verbosity in ("low", "high"):
            raise refusal("verbosity", "unsupported_parameter", f"verbosity {verbosity!r} asks a reasoning model "
                          f"for shorter or longer answers, which this server does not steer; send 'medium' or leave "
                          f"it out, and bound the output with max_tokens")
        return data

    @field_validator("metadata")
    @classmethod
    def _metadata_within_openai_limits(cls, value):
        if value is None:
            return value
        if len(value) > MAX_METADATA_PAIRS:
            raise ValueError(f"at most {MAX_METADATA_PAIRS} key-value pairs, got {len(value)}")
        for key, text in value.items():
            if len(key) > MAX_METADATA_KEY_CHARS or len(text) > MAX_METADATA_VALUE_CHARS:
                raise ValueError(f"keys are at most {MAX_METADATA_KEY_CHARS} characters and values at most "
                                 f"{MAX_METADATA_VALUE_CHARS} (key {key[:MAX_METADATA_KEY_CHARS]!r}...)")
        return value
