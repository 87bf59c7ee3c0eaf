"""Structured outputs with xgrammar: a request's `GrammarSpec` compiled against the artifact's
tokenizer into a grammar matcher; each step the matcher's token bitmask masks the logits, and each
sampled token advances the matcher. The request ends when the grammar does (its stop token).

The mask of step N+1 depends on step N's token, which the host must have read: the engine runs the
steps of a batch holding a grammar synchronously (engine_core.py).
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future
from functools import cached_property
from pathlib import Path

import torch

from atom_aot.runtime.sampling.grammar_compiler import GrammarCompilePool
from atom_aot.runtime.sampling_params import GrammarSpec

log = logging.getLogger("atom_aot")

CACHE_ENTRIES = 64          # compiled grammars kept, least recently used dropped first


class Grammars:
    """Compiles grammars for one tokenizer off the engine loop (grammar_compiler.py), and keeps the last
    CACHE_ENTRIES compiled, keyed by their spec, so a repeated schema compiles once. Lazily: the compile workers
    start, and xgrammar reads the whole vocabulary, at the first structured request (which waits for that)."""

    def __init__(self, tokenizer_dir: Path, vocab_size: int, stop_token_ids: frozenset[int],
                 compile_timeout_s: float, compile_workers: int):
        """`compile_timeout_s`, `compile_workers`: RuntimeConfig's grammar_compile_timeout and _workers."""
        self.tokenizer_dir = Path(tokenizer_dir)
        self.vocab_size = vocab_size          # the model's logits width (may exceed the tokenizer's vocabulary)
        self.stop_token_ids = sorted(stop_token_ids)
        self.compile_timeout_s = compile_timeout_s
        self.compile_workers = compile_workers
        self.cache_hits = 0
        self._cache: OrderedDict[GrammarSpec, object] = OrderedDict()
        self._compiling: dict[GrammarSpec, Future] = {}    # one compile per spec, whoever asks meanwhile
        self._lock = threading.Lock()                       # the pool's threads settle what they compiled

    def tokenizer_info(self):
        """xgrammar's view of the tokenizer (read once, by the compile pool's thread)."""
        import xgrammar as xgr
        info = xgr.TokenizerInfo.from_huggingface(_hf_tokenizer(self.tokenizer_dir), vocab_size=self.vocab_size,
                                                  stop_token_ids=self.stop_token_ids)
        log.info("structured outputs: xgrammar over %d tokens (%s), %d compile worker(s), %g s per compile; steps "
                 "of batches holding a structured request run synchronously (no async scheduling for them)",
                 self.vocab_size, info.vocab_type.name, self.compile_workers, self.compile_timeout_s)
        return info

    @cached_property
    def pool(self) -> GrammarCompilePool:
        return GrammarCompilePool(self.tokenizer_info, self.compile_workers, self.compile_timeout_s)

    def request(self, spec: GrammarSpec) -> Future:
        """`spec` compiled: a future of the CompiledGrammar, already done on a cache hit; its exception is a
        RequestError (the spec does not compile, or not within the time limit)."""
        with self._lock:
            if spec in self._cache:
                self._cache.move_to_end(spec)
                self.cache_hits += 1
                done: Future = Future()
                done.set_result(self._cache[spec])
                return done
            if spec in self._compiling:
                return self._compiling[spec]
            future = self._compiling[spec] = self.pool.submit(spec)
        future.add_done_callback(lambda f: self._settle(spec, f))
        return future

    def compiled(self, spec: GrammarSpec):
        """`spec` compiled, waiting for it (the offline engine's check before it queues a request)."""
        return self.request(spec).result()

    def matcher(self, compiled):
        """A fresh matcher over a compiled grammar."""
        import xgrammar as xgr
        return xgr.GrammarMatcher(compiled)

    def close(self) -> None:
        if "pool" in self.__dict__:
            self.pool.close()

    def _settle(self, spec: GrammarSpec, future: Future) -> None:
        with self._lock:
            self._compiling.pop(spec, None)
            if future.exception() is None:
                self._cache[spec] = future.result()
                while len(self._cache) > CACHE_ENTRIES:
                    self._cache.popitem(last=False)


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
