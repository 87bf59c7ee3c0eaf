"""The sampler's mask thresholds: atom_triton::sampling_threshold (no sort; under TRITON_INTERPRET=1 without a GPU)
against ops/sampling.py's reference (a sort, float64 nucleus sums) on fresh random logits: vocabularies around the
kernel's block and a few times its chunk (rows split over several programs), top-k at its edges (1, V - 1, V,
beyond), top-p from almost nothing to almost everything, min-p, rows with banned (-inf) tokens, ties (bf16-rounded
logits), huge and all-negative logits; the sampler drawing the same tokens with either; and the `sample` package's
export (rows and vocabulary symbolic, a launch per search pass, no host reads, only scratch written)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from triton_support import DEVICE, poisoned_outputs  # noqa: F401 (an autouse fixture)

from atom_aot.errors import StartupError
from atom_aot.ops.sampling import mask_below, sampling_threshold
from atom_aot.ops.triton.sampling_threshold import (BLOCK, MAX_SPLITS, MIN_CHUNK, PASSES, launch_sampling_threshold,
                                                    split_rows)
from atom_aot.runtime.sampling.sampler import KERNEL_MIN_ROWS, Sampler
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.runtime.scheduling.sequence import Sequence

ROOT = Path(__file__).resolve().parents[1]
# per row (top_k, top_p, min_p), the first rows the commonest: top-p alone, then everything at once
SETTINGS = [(0, 0.95, 0.0), (40, 0.9, 0.01), ("V-1", 1e-6, 0.0), (1, 0.9, 0.0), (3, 0.5, 0.05), ("V", 0.999, 0.0),
            ("V+5", 0.7, 0.2), (0, 1.0, 0.3), (0, 1.0, 0.0)]


def settings(rows: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    k_of = {"V-1": vocab - 1, "V": vocab, "V+5": vocab + 5}
    chosen = [SETTINGS[i % len(SETTINGS)] for i in range(rows)]
    return (torch.tensor([k_of.get(k, k) for k, _, _ in chosen], dtype=torch.int64),
            torch.tensor([p for _, p, _ in chosen], dtype=torch.float32),
            torch.tensor([m for _, _, m in chosen], dtype=torch.float32))


def both(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    top_k, top_p, min_p = settings(*logits.shape)
    want = sampling_threshold(logits, top_k, top_p, min_p)
    got = launch_sampling_threshold(logits.to(DEVICE), top_k.to(DEVICE), top_p.to(DEVICE), min_p.to(DEVICE))
    return got.cpu(), want


@pytest.mark.parametrize("vocab", [7, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK + 17])
def test_the_kernel_finds_the_references_thresholds(vocab):
    logits = torch.randn(9, vocab, generator=torch.Generator().manual_seed(vocab)) * 3
    got, want = both(logits)
    assert torch.equal(got, want)
    kept = mask_below(logits, got) > float("-inf")
    assert kept.gather(-1, logits.argmax(-1, keepdim=True)).all()        # the most likely token always stays


@pytest.mark.parametrize("rows", [1, 3, 9])
def test_rows_split_over_several_programs(rows):
    """A vocabulary of a few chunks: each pass's sums come from 4 programs per row (the last chunk partial), the
    nucleus' edge and the k-th largest in any of them."""
    vocab = 3 * MIN_CHUNK + 17
    assert split_rows(rows, vocab)[0] == 4
    g = torch.Generator().manual_seed(rows)
    logits = torch.randn(rows, vocab, generator=g) * 2.5
    logits[:, torch.randperm(vocab, generator=g)[:20]] += 8 * torch.rand(rows, 20, generator=g)   # a few likely
    got, want = both(logits)
    assert torch.equal(got, want)


@pytest.mark.parametrize("rows, vocab, splits", [(1, 7, 1), (1, 151936, 38), (64, 151936, 16), (256, 151936, 4),
                                                 (256, 128256, 4), (1, 1 << 22, MAX_SPLITS), (4096, 151936, 1),
                                                 (1 << 16, 32000, 1)])
def test_splits_fill_the_gpu_with_chunks_of_whole_blocks(rows, vocab, splits):
    """~1024 programs in all where the vocabulary allows chunks of MIN_CHUNK logits, at most MAX_SPLITS per row."""
    got, chunk = split_rows(rows, vocab)
    assert got == splits and chunk % BLOCK == 0 and (splits - 1) * chunk < vocab <= splits * chunk
    assert chunk >= MIN_CHUNK or splits == 1


def test_banned_tokens_and_rows_with_fewer_allowed_than_k():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(9, 700, generator=g) * 2
    logits[torch.rand(9, 700, generator=g) < 0.6] = float("-inf")         # bad words, a grammar's mask
    logits[1, :2], logits[1, 2:] = torch.tensor([1.5, -0.5]), float("-inf")   # two allowed, top_k 40
    got, want = both(logits)
    assert torch.equal(got, want)
    assert got[1] == logits[1, :2].min()


def test_ties_keep_every_token_equal_to_the_threshold():
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(9, 900, generator=g) * 2).to(torch.bfloat16).float()   # hundreds of equal values
    got, want = both(logits)
    assert torch.equal(got, want)
    rows = torch.full((3, 40), -3.0)
    rows[0, :7] = torch.tensor([10.0, 9.0, 8.0, 8.0, 8.0, 8.0, 8.0])   # top-k 3 ends among five 8s
    rows[1, :5] = torch.tensor([5.0, 3.0, 3.0, 3.0, 3.0])              # top-p 0.7 ends among four 3s (5 alone: 0.65)
    # top-k 3 ends among 0.0 and -0.0 (equal: all four in the set), so top-p 0.8 ends there too (without them: at 1)
    rows[2, :6] = torch.tensor([2.0, 1.0, 0.0, -0.0, 0.0, -0.0])
    params = (torch.tensor([3, 0, 3]), torch.tensor([1.0, 0.7, 0.8]), torch.zeros(3))
    got = launch_sampling_threshold(rows.to(DEVICE), *(t.to(DEVICE) for t in params)).cpu()
    assert torch.equal(got, sampling_threshold(rows, *params)) and got.tolist() == [8.0, 3.0, 0.0]
    assert (mask_below(rows, got) > float("-inf")).sum(-1).tolist() == [7, 5, 6]


@pytest.mark.parametrize("scale, shift", [(300.0, 0.0), (0.01, -50.0), (1.0, 1e4)])
def test_huge_tiny_and_shifted_logits(scale, shift):
    logits = torch.randn(9, 600, generator=torch.Generator().manual_seed(3)) * scale + shift
    got, want = both(logits)
    assert torch.equal(got, want)


def test_the_kernel_refuses_what_it_cannot_read():
    logits = torch.randn(2, 10, device=DEVICE)
    ok = (torch.zeros(2, dtype=torch.int64, device=DEVICE), torch.ones(2, device=DEVICE), torch.zeros(2, device=DEVICE))
    with pytest.raises(ValueError, match="top_k must be"):
        launch_sampling_threshold(logits, ok[0].int(), ok[1], ok[2])
    with pytest.raises(ValueError, match="logits must be float32"):
        launch_sampling_threshold(logits.half(), *ok)


def seqs_of(params: list[SamplingParams], sampler: Sampler) -> list[Sequence]:
    seqs = []
    for i, p in enumerate(params):
        seq = Sequence(request_id=str(i), token_ids=[1], num_prompt_tokens=1, params=p, block_size=16)
        seq.generator = sampler.new_request_generator(p.seed)
        seqs.append(seq)
    return seqs


def test_the_sampler_draws_the_same_tokens_with_the_kernels_thresholds():
    """A row without top-k sends the batch through the whole-vocabulary masks: with the kernel's thresholds (the
    `sample` package's on GPUs) the seeded rows draw what they draw with the reference's."""
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=1), SamplingParams(temperature=1.0, top_p=0.5,
              min_p=0.05, seed=2), SamplingParams(temperature=0.7, top_k=20, top_p=0.95, seed=3)]
    by_reference = Sampler(torch.device(DEVICE), seed=7)
    by_kernel = Sampler(torch.device(DEVICE), seed=7, threshold=launch_sampling_threshold, kernel_min_rows=1)
    assert by_kernel.compiled_threshold and not by_reference.compiled_threshold
    seqs_a, seqs_b = seqs_of(params, by_reference), seqs_of(params, by_kernel)
    g = torch.Generator().manual_seed(4)
    for _ in range(6):
        logits = (torch.randn(3, 800, generator=g) * 3).to(DEVICE)
        assert torch.equal(by_reference(logits, seqs_a), by_kernel(logits, seqs_b))


def test_an_artifacts_sample_package_is_what_the_sampler_calls(caplog):
    from atom_aot.artifact.phase import Phase
    from atom_aot.runtime.loading.compiled import CompiledMTP, CompiledModel, CompiledSampler, package_class
    assert (package_class(Phase.SAMPLE), package_class(Phase.MTP), package_class(Phase.MIXED)) == (
        CompiledSampler, CompiledMTP, CompiledModel)
    calls = []

    def package(*args):
        calls.append(args)
        return launch_sampling_threshold(*args)
    caplog.set_level("INFO", logger="atom_aot")
    sampler = Sampler.for_artifact({Phase.MIXED: None, Phase.SAMPLE: package}, torch.device(DEVICE))
    assert f"masks by the artifact's `sample` package (a Triton kernel, no vocabulary sort) from {KERNEL_MIN_ROWS}" \
        in caplog.text
    for rows, called in ((KERNEL_MIN_ROWS - 1, 0), (KERNEL_MIN_ROWS, 1)):      # the sort below, the kernel from
        seqs = seqs_of([SamplingParams(temperature=1.0, top_p=0.8, seed=5)] * rows, sampler)
        sampler(torch.randn(rows, 300, device=DEVICE), seqs)
        assert len(calls) == called
    always = Sampler.for_artifact({Phase.SAMPLE: package}, torch.device(DEVICE),
                                  environ={"ATOM_SAMPLING_MASKS": "kernel"})
    always(torch.randn(1, 300, device=DEVICE), seqs_of([SamplingParams(temperature=1.0, top_p=0.8, seed=5)], always))
    assert len(calls) == 2 and "at any rows (ATOM_SAMPLING_MASKS=kernel)" in caplog.text
    assert not Sampler.for_artifact({Phase.MIXED: None}, torch.device("cpu")).compiled_threshold
    assert "masks by sorting the vocabulary" in caplog.text
    sorting = Sampler.for_artifact({Phase.SAMPLE: package}, torch.device("cpu"),
                                   environ={"ATOM_SAMPLING_MASKS": "sort"})
    assert not sorting.compiled_threshold and "ATOM_SAMPLING_MASKS=sort; the artifact's `sample` package is not used" \
        in caplog.text
    with pytest.raises(StartupError, match="ATOM_SAMPLING_MASKS='fast'"):
        Sampler.for_artifact({}, torch.device("cpu"), environ={"ATOM_SAMPLING_MASKS": "fast"})


EXPORT_SCRIPT = r'''
import torch
import triton
from triton.backends.compiler import GPUTarget
from atom_aot.build.export_sampler import export_sampler
from export_recording import host_reads, launch_kinds, written


class Hopper:        # torch's mutation analysis compiles the kernels to TTIR for the active target: sm90 stands in
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


triton.runtime.driver.set_active(Hopper())
ep = export_sampler(1000, torch.device("cpu"))
decomposed = ep.run_decompositions(decompose_custom_triton_ops=True)
print("SAMPLER", launch_kinds(decomposed), host_reads(decomposed), written(decomposed))
'''


def test_the_sample_package_exports_a_launch_per_pass_writing_only_scratch():
    """Symbolic grids, no host reads, and torch's mutation analysis sees the passes write only their scratch (a
    kernel it could not read would have every launch copy the logits)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", EXPORT_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    passes = [("search_pass_kernel", True)] * (2 * PASSES)
    scratch = [["max_ptr", "bounds_ptr", "sums_ptr"]] * PASSES + [["bounds_ptr", "sums_ptr"]] * PASSES
    launches, writes = passes + [("threshold_kernel", True)], scratch + [["out_ptr"]]
    assert proc.stdout.splitlines()[-1] == f"SAMPLER {launches} 0 {writes}"
