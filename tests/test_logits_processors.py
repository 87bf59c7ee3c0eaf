"""Logits processors (penalties, logit_bias, min_tokens, bad words): checked against vLLM's
definitions written out row by row, then on the tiny model: the same tokens with and without async
scheduling (the counts live on the device), and repetition_penalty equal to transformers'."""
from __future__ import annotations

import pytest
import torch
from factories import random_prompts
from test_async_scheduling import both_ways, generate

from atom_aot.runtime.sampling.logits_processors import LogitsProcessors, apply_penalties
from atom_aot.runtime.sampling.sampler import Sampler
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.runtime.scheduling.sequence import Sequence

EOS = 5


def seq_of(prompt, output=(), request_id="r", **params) -> Sequence:
    """A sequence as the sampler sees it: `output` known, the token being sampled pending."""
    seq = Sequence(request_id=request_id, token_ids=list(prompt) + list(output), num_prompt_tokens=len(prompt),
                   params=SamplingParams(**params), block_size=16, eos_token_ids=frozenset({EOS}))
    seq.num_pending_tokens = 1
    return seq


def vllm_penalties(logits: list[float], prompt: list[int], output: list[int], presence: float, frequency: float,
                   repetition: float) -> list[float]:
    """vLLM's apply_penalties, one token at a time."""
    out = []
    for token, value in enumerate(logits):
        if token in prompt or token in output:
            value = value / repetition if value > 0 else value * repetition
        count = output.count(token)
        out.append(value - frequency * count - presence * (count > 0))
    return out


def test_penalties_match_vllms_definition():
    torch.manual_seed(0)
    logits = torch.randn(3, 12)
    cases = [([1, 2, 3], [3, 3, 7], 0.5, 0.25, 1.3), ([0], [], 1.0, 1.0, 2.0), ([4, 4], [9, 4, 9, 9], -0.5, 0.1, 0.8)]
    counts = torch.zeros(3, 12, dtype=torch.int32)
    in_prompt = torch.zeros(3, 12, dtype=torch.bool)
    for row, (prompt, output, *_) in enumerate(cases):
        in_prompt[row, prompt] = True
        for t in output:
            counts[row, t] += 1
    got = apply_penalties(logits, counts, in_prompt, *(torch.tensor([c[i] for c in cases]) for i in (2, 3, 4)))
    for row, (prompt, output, presence, frequency, repetition) in enumerate(cases):
        expected = vllm_penalties(logits[row].tolist(), prompt, output, presence, frequency, repetition)
        assert got[row].tolist() == pytest.approx(expected)


def test_counts_grow_with_recorded_tokens_and_a_finished_requests_slot_is_reused():
    processors = LogitsProcessors(torch.device("cpu"))
    a = seq_of([1, 2], request_id="a", frequency_penalty=1.0)
    plain = seq_of([1], request_id="p")
    logits = torch.zeros(2, 8)
    for token in (3, 3, 6):
        out = processors.apply(logits, [a, plain])
        processors.record([a, plain], torch.tensor([token, 0]))
    out = processors.apply(logits, [a, plain])
    assert out[0].tolist() == [0, 0, 0, -2, 0, 0, -1, 0] and out[1].tolist() == [0] * 8
    a.status = a.status.FINISHED
    b = seq_of([7], request_id="b", repetition_penalty=2.0)
    out = processors.apply(torch.ones(1, 8), [b])
    assert out[0].tolist() == [1, 1, 1, 1, 1, 1, 1, 0.5]              # a's counts are gone from the slot
    assert processors.token_counts.counts.shape[0] == 1


def test_nothing_to_apply_returns_the_same_tensor():
    logits = torch.randn(2, 8)
    assert LogitsProcessors(torch.device("cpu")).apply(logits, [seq_of([1]), seq_of([2], temperature=0)]) is logits


def test_logit_bias_min_tokens_and_bad_words():
    processors = LogitsProcessors(torch.device("cpu"))
    seqs = [seq_of([1], logit_bias={4: 100.0, 2: -3.0}),
            seq_of([1], output=[0], min_tokens=2, stop_token_ids=[6]),         # 1 token out: EOS and 6 masked
            seq_of([1], output=[0, 1], min_tokens=2),                          # 2 out: nothing masked
            seq_of([1], output=[2, 3], bad_words_token_ids=[[7], [3, 1], [2, 1], [9, 3, 0]])]
    out = processors.apply(torch.zeros(4, 10), seqs)
    inf = float("-inf")
    assert out[0].tolist() == [0, 0, -3, 0, 100, 0, 0, 0, 0, 0]
    assert out[1].tolist() == [0, 0, 0, 0, 0, inf, inf, 0, 0, 0]
    assert out[2].tolist() == [0] * 10
    assert out[3].tolist() == [0, inf, 0, 0, 0, 0, 0, inf, 0, 0]          # [7] always; [3, 1] after a 3


def test_sampler_greedy_follows_the_bias():
    sampler = Sampler(torch.device("cpu"))
    logits = torch.tensor([[5.0, 1.0, 0.0]])
    assert sampler(logits, [seq_of([0], temperature=0, logit_bias={2: 100.0})]).tolist() == [2]
    assert sampler(logits, [seq_of([0], temperature=0)]).tolist() == [0]


def test_samplingparams_refuse_out_of_range_values():
    for bad in (dict(presence_penalty=2.5), dict(frequency_penalty=-3), dict(repetition_penalty=0),
                dict(min_tokens=-1), dict(min_tokens=9, max_tokens=4), dict(bad_words_token_ids=[[]])):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


# -- the tiny model, end to end --------------------------------------------------------------
@pytest.fixture(scope="module")
def engines(tiny_llama_eager_artifact):
    return both_ways(tiny_llama_eager_artifact)


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(6, 380, seed=5, lengths=(4, 30))


def test_penalized_outputs_are_the_same_with_async_scheduling(engines, prompts):
    params = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, presence_penalty=0.3 * i,
                             frequency_penalty=0.2, repetition_penalty=1.0 + 0.1 * i) for i in range(len(prompts))]
    params[0] = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)       # beside unpenalized rows
    sync, overlapped = (generate(engine, prompts, params) for engine in engines)
    assert overlapped == sync
    plain = generate(engines[0], prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    assert plain[0] == sync[0] and plain[1:] != sync[1:]


def test_repetition_penalty_equals_transformers(engines, tiny_llama_dir, prompts):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir), dtype=torch.float32).eval()
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, repetition_penalty=1.8)
    ours = generate(engines[1], prompts[:3], params)
    for prompt, (ids, _, _) in zip(prompts[:3], ours):
        with torch.no_grad():
            ref = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, repetition_penalty=1.8,
                                 eos_token_id=None, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
        assert ids == ref[0, len(prompt):].tolist()


def test_a_strong_frequency_penalty_stops_repeats(engines, prompts):
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, frequency_penalty=2.0,
                            presence_penalty=2.0)
    plain = generate(engines[1], prompts, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    penalized = generate(engines[1], prompts, params)
    distinct = [len(set(ids)) for ids, _, _ in penalized]
    assert sum(distinct) > sum(len(set(ids)) for ids, _, _ in plain)


def test_min_tokens_delays_eos_and_bias_forces_a_token(engines, prompts):
    """EOS biased up ends every request at once; min_tokens=5 masks it for 5 tokens, then it ends it."""
    eos = min(engines[1].core.eos_token_ids)
    for min_tokens, length in ((0, 1), (5, 6)):
        params = SamplingParams(temperature=0, max_tokens=30, min_tokens=min_tokens, logit_bias={eos: 100.0})
        for sync, overlapped in zip(*(generate(engine, prompts, params) for engine in engines)):
            assert sync == overlapped
            assert len(sync[0]) == length and sync[0][-1] == eos and sync[2] == "stop"
    forced = generate(engines[1], prompts[:2], SamplingParams(temperature=0.8, seed=1, max_tokens=5, ignore_eos=True,
                                                              logit_bias={42: 100.0}))
    assert all(ids == [42] * 5 for ids, _, _ in forced)
