"""Structured outputs with xgrammar: a request's `GrammarSpec` compiled against the artifact's
tokenizer into a grammar matcher; each step the matcher's token bitmask masks the logits, and each
sampled token advances the matcher. The request ends when the grammar does (its stop token).

The mask of step N+1 depends on step N's token, which the host must have read: the engine runs the
steps of a batch holding a grammar synchronously (engine_core.py).
"""
from __future__ import annotations

import json
import logging
from functools import cached_property
from pathlib import Path

import torch

from atom_aot.errors import RequestError
from atom_aot.runtime.sampling_params import GrammarSpec

log = logging.getLogger("atom_aot")


class Grammars:
    """Compiles grammars for one tokenizer (lazily: xgrammar reads the whole vocabulary once, at the
    first structured request). Compiled grammars are cached by xgrammar, keyed by their text."""

    def __init__(self, tokenizer_dir: Path, vocab_size: int, stop_token_ids: frozenset[int]):
        self.tokenizer_dir = Path(tokenizer_dir)
        self.vocab_size = vocab_size          # the model's logits width (may exceed the tokenizer's vocabulary)
        self.stop_token_ids = sorted(stop_token_ids)

    @cached_property
    def compiler(self):
        import xgrammar as xgr
        info = xgr.TokenizerInfo.from_huggingface(_hf_tokenizer(self.tokenizer_dir), vocab_size=self.vocab_size,
                                                  stop_token_ids=self.stop_token_ids)
        log.info("structured outputs: xgrammar over %d tokens (%s); steps of batches holding a structured "
                 "request run synchronously (no async scheduling for them)", self.vocab_size, info.vocab_type.name)
        return xgr.GrammarCompiler(info)

    def matcher(self, spec: GrammarSpec):
        """A fresh matcher for `spec` (compiled once: xgrammar caches what it compiled)."""
        import xgrammar as xgr
        return xgr.GrammarMatcher(self.compiled(spec))

    def compiled(self, spec: GrammarSpec):
        """`spec` compiled; an invalid schema, regex or grammar is the request's error."""
        try:
            return self._compile(spec)
        except (RuntimeError, ValueError) as e:
            reason = str(e).splitlines()[0].split("] ", 1)[-1]      # xgrammar's message, without its log prefix
            raise RequestError(f"the {spec.kind} of this request's structured output does not compile: "
                               f"{reason}") from None

    def _compile(self, spec: GrammarSpec):
        if spec.kind == "json_object":
            return self.compiler.compile_builtin_json_grammar()
        if spec.kind == "json_schema":
            # compact JSON: "any whitespace" lets small models emit blanks until max_tokens
            return self.compiler.compile_json_schema(spec.value, any_whitespace=False)
        if spec.kind == "regex":
            return self.compiler.compile_regex(spec.value)
        if spec.kind == "choice":
            return self.compiler.compile_grammar(choice_grammar(spec.choices))
        return self.compiler.compile_grammar(spec.value)


def choice_grammar(choices: tuple[str, ...]) -> str:
    """EBNF whose language is exactly `choices` (xgrammar's string literals take JSON's escapes)."""
    return "root ::= " + " | ".join(json.dumps(choice, ensure_ascii=False) for choice in choices)


def _hf_tokenizer(tokenizer_dir: Path):
    """transformers' fast tokenizer over the artifact's tokenizer (xgrammar reads its vocabulary type
    from the backend's pipeline)."""
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def grammar_bitmask(matchers: list, vocab_size: int) -> torch.Tensor:
    """Each matcher's allowed next tokens as a host bitmask: int32 [n, ceil(V / 32)], bit j of word w
    for token 32 w + j."""
    import xgrammar as xgr
    bitmask = xgr.allocate_token_bitmask(len(matchers), vocab_size)
    for row, matcher in enumerate(matchers):
        matcher.fill_next_token_bitmask(bitmask, row)
    return bitmask


def apply_grammar_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits [n, V] with the tokens the bitmask ([n, ceil(V / 32)] int32, on logits' device) forbids
    set to -inf. Plain torch ops, not xgrammar's apply_token_bitmask_inplace, whose GPU kernels are
    compiled on first use: the runtime compiles nothing."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :logits.shape[-1]]   # [n, 32 W] -> [n, V]
    return logits.masked_fill(~allowed, float("-inf"))


def accept_sampled(matcher, token: int, request_id: str) -> bool:
    """Advance the matcher by a sampled token. The mask allowed only what the grammar takes, unless the
    request's bad words masked every token it allowed: then False (the request cannot go on)."""
    if matcher.accept_token(token):
        return True
    log.warning("request %r: its bad words leave no token its grammar allows; it ends here (finish_reason "
                "'abort')", request_id)
    return False
