"""The rejection sampler of speculative decoding on synthetic distributions: greedy verification is
the argmax, and sampled verification emits tokens distributed exactly as the target's p, whatever
the draft's q (chi-square tests with fixed seeds on a vocabulary of 5)."""
from __future__ import annotations

import torch

from atom_aot.runtime.spec.rejection import verify_greedy, verify_sampled, verify_sampled_batch

P = torch.tensor([[0.50, 0.20, 0.15, 0.10, 0.05],      # target at the last known token
                  [0.05, 0.10, 0.15, 0.30, 0.40],      # after draft 1
                  [0.20, 0.20, 0.20, 0.20, 0.20]])     # after draft 2: the bonus token's
Q = torch.tensor([[0.10, 0.10, 0.60, 0.10, 0.10],
                  [0.40, 0.30, 0.10, 0.10, 0.10]])
TRIALS = 6000


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """P(a chi-square statistic this large | counts drawn from probs)."""
    expected = probs * counts.sum()
    statistic = ((counts - expected) ** 2 / expected).sum()
    return float(torch.special.gammaincc(torch.tensor((len(probs) - 1) / 2), statistic / 2))


def emitted(draft_probs: torch.Tensor | None, drafts_of) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Counts of the first token of each run, of the second where there is one, and of run lengths."""
    g = torch.Generator().manual_seed(0)
    first, second, lengths = torch.zeros(5), torch.zeros(5), torch.zeros(4)
    for _ in range(TRIALS):
        run = verify_sampled(P, drafts_of(g), draft_probs, g)
        first[run[0]] += 1
        if len(run) > 1:
            second[run[1]] += 1
        lengths[len(run)] += 1
    return first, second, lengths


class TestGreedy:
    def test_accepts_the_drafts_that_are_the_argmax_then_gives_the_argmax(self):
        chosen = torch.log(P).argmax(-1).tolist()         # argmax: 0, 4, then a tie broken to 0
        assert verify_greedy(chosen, [0, 4]) == [0, 4, 0]
        assert verify_greedy(chosen, [0, 3]) == [0, 4]
        assert verify_greedy(chosen, [1, 4]) == [0]
        assert verify_greedy(chosen[:1], []) == [0]


class TestSampled:
    def test_drafts_from_q_give_tokens_distributed_as_p(self):
        first, second, _ = emitted(Q, lambda g: [int(torch.multinomial(row, 1, generator=g)) for row in Q])
        assert chi_square_p_value(first, P[0]) > 1e-3
        assert chi_square_p_value(second, P[1]) > 1e-3       # given the first draft was accepted

    def test_point_mass_guesses_give_tokens_distributed_as_p(self):
        first, second, lengths = emitted(None, lambda g: [3, 4])
        assert chi_square_p_value(first, P[0]) > 1e-3
        assert chi_square_p_value(second, P[1]) > 1e-3
        # draft 1 (token 3) is accepted with p = 0.10, draft 2 (token 4) then with 0.40
        expected = torch.tensor([0, 0.9, 0.1 * 0.6, 0.1 * 0.4])
        assert chi_square_p_value(lengths[1:], expected[1:]) > 1e-3

    def test_a_certain_draft_is_always_accepted_and_an_impossible_one_never(self):
        certain = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
        g = torch.Generator().manual_seed(1)
        assert all(verify_sampled(certain, [1], None, g) == [1, 2] for _ in range(50))
        assert all(verify_sampled(certain, [0], None, g) == [1] for _ in range(50))

    def test_the_same_seed_gives_the_same_run(self):
        runs = [verify_sampled(P, [3, 4], None, torch.Generator().manual_seed(7)) for _ in range(2)]
        assert runs[0] == runs[1]

    def test_a_batch_gives_each_sequence_the_run_it_gets_alone(self):
        """Sequences with 0, 1 and 2 drafts (point masses and a draft distribution), each with its own
        seeded generator: verified together (one read back) or one by one, the same runs."""
        def items(seed):
            return [(P, [3, 4], None, torch.Generator().manual_seed(seed)),
                    (P[:1], [], None, torch.Generator().manual_seed(seed + 1)),
                    (P, [2, 0], Q, torch.Generator().manual_seed(seed + 2)),
                    (P[:2], [0], None, torch.Generator().manual_seed(seed + 3))]
        for seed in range(40):
            alone = [verify_sampled(*item) for item in items(seed)]
            assert verify_sampled_batch(items(seed)) == alone
            assert all(1 <= len(run) <= k + 1 for run, k in zip(alone, [2, 0, 2, 1]))
        assert verify_sampled_batch([]) == []
