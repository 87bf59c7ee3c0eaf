"""Structured outputs in the engine: the bitmask applied as xgrammar's own kernel applies it, and on the
tiny model the same outputs with and without async scheduling (the steps of a batch holding a grammar
run synchronously, and are counted)."""
from __future__ import annotations

import json

import pytest
import torch
import xgrammar as xgr
from factories import random_prompts
from test_async_scheduling import both_ways, generate

from atom_aot.runtime.sampling.grammar_worker import choice_grammar
from atom_aot.runtime.sampling.structured_output import apply_grammar_bitmask
from atom_aot.runtime.sampling_params import GrammarSpec, SamplingParams

SCHEMA = {"type": "object", "required": ["n", "ok"], "additionalProperties": False,
          "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}, "ok": {"type": "boolean"}}}


@pytest.mark.parametrize("vocab", [31, 32, 100])
def test_bitmask_masks_what_xgrammars_kernel_masks(vocab):
    torch.manual_seed(vocab)
    bitmask = torch.randint(-2 ** 31, 2 ** 31 - 1, xgr.get_bitmask_shape(3, vocab), dtype=torch.int32)
    logits = torch.randn(3, vocab)
    expected = logits.clone()
    xgr.apply_token_bitmask_inplace(expected, bitmask)
    assert torch.equal(apply_grammar_bitmask(logits, bitmask), expected)


def test_choice_grammar_escapes_its_strings():
    choices = ('say "hi"', "back\\slash", "naïve\n")
    grammar = xgr.Grammar.from_ebnf(choice_grammar(choices))
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([chr(c) for c in range(32, 127)] + ["ï", "\n"]))
    for choice in choices:
        matcher = xgr.GrammarMatcher(compiler.compile_grammar(grammar), terminate_without_stop_token=True)
        assert matcher.accept_string(choice) and matcher.is_terminated()


@pytest.fixture(scope="module")
def engines(tiny_llama_eager_artifact):
    return both_ways(tiny_llama_eager_artifact)


def test_grammars_beside_free_requests_give_the_same_outputs_either_way(engines):
    prompts = random_prompts(6, 380, seed=9, lengths=(3, 20))
    specs = [GrammarSpec("json_schema", json.dumps(SCHEMA)), None, GrammarSpec("regex", "[0-9]{4}"), None,
             GrammarSpec("choice", choices=("alpha", "beta")), None]
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=40, grammar=spec) for i, spec in enumerate(specs)]
    sync, overlapped = (generate(engine, prompts, params) for engine in engines)
    assert overlapped == sync
    assert json.loads(sync[0][1]).keys() == {"n", "ok"} and sync[2][1].isdigit() and sync[4][1] in ("alpha", "beta")
    assert all(reason == "stop" for _, _, reason in sync[::2])
    assert engines[1].core.stats().synchronous_steps_total > 0 and engines[0].core.stats().synchronous_steps_total == 0
    free = generate(engines[1], prompts[1::2], params[1::2])
    steps = engines[1].core.stats().synchronous_steps_total
    assert free == sync[1::2] and engines[1].core.stats().synchronous_steps_total == steps   # none without grammars
