"""Sampler: masks checked against a direct computation; seeds reproducible whatever the batch."""
import math

import pytest
import torch

from atom_aot.runtime.sampling.sampler import Sampler, apply_top_k_top_p_min_p, compute_logprobs
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.runtime.scheduling.sequence import Sequence

# The sampler runs where the logits are: CPU here, and the GPU too where there is one.
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def direct_mask(logits: torch.Tensor, top_k: int, top_p: float, min_p: float) -> set[int]:
    """The kept token ids, computed one rule at a time in float64 from the definitions."""
    values = logits.double().tolist()
    order = sorted(range(len(values)), key=lambda i: -values[i])
    kept = order[:top_k] if top_k > 0 else order
    kth = values[kept[-1]]
    kept = [i for i in order if values[i] >= kth]                 # ties with the k-th stay
    z = sum(math.exp(values[i]) for i in kept)
    probs = {i: math.exp(values[i]) / z for i in kept}
    nucleus, mass = [], 0.0
    for i in kept:
        if mass >= top_p:
            break
        nucleus.append(i)
        mass += probs[i]
    top = probs[nucleus[0]]
    return {i for i in nucleus if probs[i] >= min_p * top} | {nucleus[0]}


@pytest.mark.parametrize("top_k,top_p,min_p", [(0, 1.0, 0.0), (5, 1.0, 0.0), (0, 0.7, 0.0), (0, 1.0, 0.1),
                                                (20, 0.9, 0.05), (1, 0.5, 0.0), (50, 0.3, 0.2)])
def test_masks_match_direct_computation(top_k, top_p, min_p):
    torch.manual_seed(top_k * 100 + int(top_p * 10))
    logits = torch.randn(6, 64) * 3
    masked = apply_top_k_top_p_min_p(logits, torch.full((6,), top_k), torch.full((6,), top_p),
                                     torch.full((6,), min_p))
    for row in range(6):
        kept = set(torch.nonzero(masked[row] > float("-inf")).flatten().tolist())
        assert kept == direct_mask(logits[row], top_k, top_p, min_p)
        assert torch.equal(masked[row][list(kept)], logits[row][list(kept)])


def test_per_row_parameters_are_independent():
    torch.manual_seed(1)
    logits = torch.randn(3, 32)
    masked = apply_top_k_top_p_min_p(logits, torch.tensor([2, 0, 0]), torch.tensor([1.0, 0.5, 1.0]),
                                     torch.tensor([0.0, 0.0, 0.0]))
    assert (masked[0] > float("-inf")).sum() == 2
    assert (masked[2] > float("-inf")).sum() == 32


def make_seqs(params_list, device="cpu"):
    sampler = Sampler(torch.device(device), seed=123)
    seqs = []
    for i, p in enumerate(params_list):
        seq = Sequence(request_id=str(i), token_ids=[1], num_prompt_tokens=1, params=p, block_size=16)
        if p.seed is not None:
            seq.generator = sampler.new_request_generator(p.seed)
        seqs.append(seq)
    return sampler, seqs


def draw(sampler, seqs, logits, steps=20):
    return [sampler(logits, seqs).tolist() for _ in range(steps)]


def test_seeded_rows_do_not_depend_on_batch():
    torch.manual_seed(0)
    row = torch.randn(1, 100)
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=42)
    alone = draw(*make_seqs([seeded]), row)
    others = [SamplingParams(temperature=0.8), SamplingParams(temperature=0), SamplingParams(temperature=1.2, seed=7)]
    sampler, seqs = make_seqs(others[:2] + [seeded] + others[2:])
    batch = torch.cat([torch.randn(2, 100), row, torch.randn(1, 100)])
    together = [step[2] for step in draw(sampler, seqs, batch)]
    assert [step[0] for step in alone] == together
    assert len(set(together)) > 1              # it really samples


def test_same_seed_same_tokens_other_seed_differs():
    torch.manual_seed(0)
    logits = torch.randn(1, 1000)
    first = draw(*make_seqs([SamplingParams(temperature=1.0, seed=5)]), logits)
    again = draw(*make_seqs([SamplingParams(temperature=1.0, seed=5)]), logits)
    other = draw(*make_seqs([SamplingParams(temperature=1.0, seed=6)]), logits)
    assert first == again and first != other


def test_greedy_rows_take_argmax_in_mixed_batch():
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    sampler, seqs = make_seqs([SamplingParams(temperature=0), SamplingParams(temperature=1.0),
                               SamplingParams(temperature=0)])
    out = sampler(logits, seqs)
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask, expected", [
    ({}, [0.5, 0.3, 0.2]),                          # temperature only: the unmasked path
    ({"top_p": 0.75}, [0.625, 0.375, 0.0]),         # the masked path renormalises what top-p keeps
])
def test_sampling_follows_distribution(mask, expected, device):
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]], device=device))
    sampler, seqs = make_seqs([SamplingParams(temperature=1.0, seed=3, **mask)], device)
    counts = torch.bincount(torch.tensor([sampler(logits, seqs).item() for _ in range(4000)]), minlength=3)
    assert torch.allclose(counts.float() / 4000, torch.tensor(expected), atol=0.03)


def test_top_k_one_is_greedy():
    torch.manual_seed(2)
    logits = torch.randn(4, 40)
    sampler, seqs = make_seqs([SamplingParams(temperature=1.5, top_k=1, seed=i) for i in range(4)])
    assert torch.equal(sampler(logits, seqs), logits.argmax(-1))


def test_logprobs_and_ranks():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    (lp,) = compute_logprobs(logits, torch.tensor([1]), [2])
    ref = torch.log_softmax(logits.double(), -1)[0]
    assert lp.rank == 2 and abs(lp.logprob - ref[1].item()) < 1e-6
    assert [t for t, _ in lp.top] == [0, 1]


class TestSamplingParamsValidation:
    @pytest.mark.parametrize("kwargs,match", [
        ({"temperature": -0.1}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"), ({"min_p": 1.5}, "min_p"), ({"max_tokens": 0}, "max_tokens"),
        ({"stop_strings": [""]}, "stop_strings"), ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"seed": "x"}, "seed"), ({"logprobs": 21}, "logprobs")])
    def test_rejects(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            SamplingParams(**kwargs)

    def test_stop_string_alone_becomes_list(self):
        assert SamplingParams(stop_strings="END").stop_strings == ["END"]


@pytest.mark.parametrize("device", DEVICES)
def test_top_k_path_draws_what_the_full_sort_draws(device):
    """Rows that all have a top-k are drawn among the top-k candidates; a row without one in the
    batch sends every row through the full-vocabulary sort. Seeded rows must draw the same tokens."""
    torch.manual_seed(5)
    with_k = [SamplingParams(temperature=0.9, top_k=k, top_p=p, min_p=m, seed=10 + i)
              for i, (k, p, m) in enumerate([(5, 1.0, 0.0), (40, 0.8, 0.0), (12, 0.95, 0.05), (1, 1.0, 0.0)])]
    greedy = SamplingParams(temperature=0)
    without_k = SamplingParams(temperature=0.9, top_p=0.9, seed=99)
    sampler_a, seqs_a = make_seqs([*with_k, greedy], device)
    sampler_b, seqs_b = make_seqs([*with_k, without_k], device)
    for _ in range(50):
        logits = torch.randn(5, 300, device=device) * 2
        a, b = sampler_a(logits, seqs_a), sampler_b(logits, seqs_b)
        assert torch.equal(a[:4], b[:4])
        assert a[4] == logits[4].argmax()
        assert a[3] == logits[3].argmax()                     # top_k=1
