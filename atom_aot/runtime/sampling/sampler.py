"""Turns logits into next tokens: the request's logits processors (penalties, bias, grammar: see
logits_processors.py), then greedy, temperature, top-k, top-p, min-p, per-request seeds.

Sampling draws one exponential variate per vocabulary entry and takes argmax(p / E), which is an
exact draw from p. A seeded request draws its variates from its own generator, so its tokens do
not depend on which other requests share the batch.
"""
from __future__ import annotations

import logging
import os
from typing import Callable, NamedTuple

import numpy as np
import torch

from atom_aot.errors import StartupError
from atom_aot.ops.sampling import mask_below, sampling_threshold
from atom_aot.runtime.outputs import TokenLogprobs
from atom_aot.runtime.sampling.logits_processors import LogitsProcessors
from atom_aot.runtime.sampling.sampling_rows import SamplingBatch
from atom_aot.runtime.scheduling.sequence import Sequence
from atom_aot.runtime.transfer import to_device

log = logging.getLogger("atom_aot")

# (logits [N, V] float32, top_k [N] int64, top_p [N] float32, min_p [N] float32) -> thresholds [N] float32
ThresholdFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
MASKS_VARIABLE = "ATOM_SAMPLING_MASKS"
MASK_MODES = ("auto", "sort", "kernel")
# auto: the package's kernel from this many rows, the sort below. The first kernel (one program per row) lost to
# the sort up to 64 rows on an H200; the split kernel gave 1.08x the sort's top-p throughput at 256-row batches
# (Qwen3-0.6B), its GPU time at 1-64 rows is not measured yet: a guess until scripts/gpu/sampling_bench.py times
# CUDA-graph replays of both.
KERNEL_MIN_ROWS = 32


def masks_path(has_package: bool, mode: str = "auto") -> str:
    """What computes the whole-vocabulary masks (the start log's and `inspect`'s words), for an artifact with or
    without a `sample` package under ATOM_SAMPLING_MASKS=`mode`."""
    if not has_package:
        return "sorting the vocabulary (torch; the artifact has no `sample` package)"
    if mode == "sort":
        return f"sorting the vocabulary ({MASKS_VARIABLE}=sort; the artifact's `sample` package is not used)"
    if mode == "kernel":
        return f"the artifact's `sample` package at any rows ({MASKS_VARIABLE}=kernel)"
    return (f"the artifact's `sample` package (a Triton kernel, no vocabulary sort) from {KERNEL_MIN_ROWS} rows, "
            f"sorting the vocabulary below")


def apply_top_k_top_p_min_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                            min_p: torch.Tensor, threshold: ThresholdFn = sampling_threshold) -> torch.Tensor:
    """Mask (to -inf) what top-k, then top-p, then min-p exclude. logits: [N, V]; the rest [N].

    top_k <= 0 keeps all; top-p keeps the smallest set of most likely tokens whose mass reaches
    top_p; min-p drops tokens less likely than min_p times the most likely one. Together they keep
    each row's tokens at or above one threshold (ops/sampling.py), tokens tied with it included;
    `threshold` computes it: the torch reference sorts the vocabulary, the artifact's `sample` package
    (a Triton kernel, on GPUs) does not.
    """
    return mask_below(logits, threshold(logits, top_k, top_p, min_p))


def _mask_params(batch: SamplingBatch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (to_device(batch.top_k, torch.int64, device), to_device(batch.top_p, torch.float32, device),
            to_device(batch.min_p, torch.float32, device))


def _sample_among_top_k(scaled: torch.Tensor, noise: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Every sampled row has a top-k: mask and draw among the batch's largest-k candidates instead of
    sorting the whole vocabulary (a full sort of a 150k vocabulary per row cost 28% of decode
    throughput on an H100). Each candidate keeps its own noise variate, so the draw equals the
    full path's, except that a tie with the k-th logit is not kept."""
    k = min(int(batch.top_k.max()), scaled.shape[-1])    # rows without one are greedy
    values, ids = scaled.topk(k, dim=-1)
    masked = apply_top_k_top_p_min_p(values, *_mask_params(batch, scaled.device))
    choice = (masked.softmax(dim=-1) / noise.gather(-1, ids)).argmax(dim=-1, keepdim=True)
    return ids.gather(-1, choice).squeeze(-1)


def scale_by_temperature(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """logits [N, V] / each row's temperature (greedy rows by 1: their draw is the argmax anyway)."""
    return logits / to_device(batch.temperature, torch.float32, logits.device).unsqueeze(-1)


def sampling_probs(logits: torch.Tensor, seqs: list[Sequence],
                   threshold: ThresholdFn = sampling_threshold) -> torch.Tensor:
    """The distribution [N, V] the sampler draws row i of `logits` from: temperature, then the
    top-k / top-p / min-p mask (speculative verification needs it whole)."""
    batch = SamplingBatch.of([seq.params for seq in seqs])
    scaled = scale_by_temperature(logits, batch)
    if batch.masks.any():
        scaled = apply_top_k_top_p_min_p(scaled, *_mask_params(batch, logits.device), threshold)
    return scaled.softmax(dim=-1)


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0, threshold: ThresholdFn | None = None,
                 kernel_min_rows: int = KERNEL_MIN_ROWS):
        """`threshold`: the artifact's compiled `sample` package where it has one (no vocabulary sort), used for
        batches of at least `kernel_min_rows` rows; the torch reference (ops/sampling.py, a sort) otherwise."""
        self.device = device
        self._kernel, self.kernel_min_rows = threshold, kernel_min_rows
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self.logits_processors = LogitsProcessors(device)

    @classmethod
    def for_artifact(cls, forwards: dict, device: torch.device, seed: int = 0, environ=os.environ) -> "Sampler":
        """The sampler of an artifact's loaded packages (`forwards`, phase -> callable): with its `sample` package's
        thresholds where it has one, unless ATOM_SAMPLING_MASKS=sort (the A/B switch); which masks run is logged."""
        from atom_aot.artifact.phase import Phase
        mode = environ.get(MASKS_VARIABLE, "auto")
        if mode not in MASK_MODES:
            raise StartupError(f"{MASKS_VARIABLE}={mode!r}: expected auto (the artifact's `sample` package from "
                               f"{KERNEL_MIN_ROWS} rows where it has one), sort or kernel (the package at any rows)")
        log.info("sampling: top-p / min-p masks by %s", masks_path(Phase.SAMPLE in forwards, mode))
        threshold = forwards.get(Phase.SAMPLE) if mode != "sort" else None
        return cls(device, seed, threshold, 1 if mode == "kernel" else KERNEL_MIN_ROWS)

    @property
    def compiled_threshold(self) -> bool:
        """Whether the artifact's `sample` package computes the masks (for batches of `kernel_min_rows` or more)."""
        return self._kernel is not None

    def threshold(self, logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  min_p: torch.Tensor) -> torch.Tensor:
        """Each row's mask threshold: the package's kernel for `kernel_min_rows` rows or more, else the sort."""
        use_kernel = self._kernel is not None and logits.shape[0] >= self.kernel_min_rows
        return (self._kernel if use_kernel else sampling_threshold)(logits, top_k, top_p, min_p)

    def new_request_generator(self, seed: int) -> torch.Generator:
        g = torch.Generator(device=self.device)
        g.manual_seed(seed)
        return g

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence], batch: SamplingBatch | None = None) -> torch.Tensor:
        """logits: [N, V] float32, one row per sequence -> next token ids [N]. `batch`: the sequences' sampling
        parameters as the runner's persistent rows hold them (read from `seqs` when not given)."""
        batch = batch if batch is not None else SamplingBatch.of([seq.params for seq in seqs])
        processed = self.logits_processors.apply(logits, seqs) if batch.any_processes else logits
        tokens = self.draw(processed, seqs, batch)
        if batch.any_processes:
            self.logits_processors.record(seqs, tokens)
        return tokens

    def draw(self, logits: torch.Tensor, seqs: list[Sequence], batch: SamplingBatch) -> torch.Tensor:
        """Next token ids [N] from processed logits [N, V]: greedy or drawn, masked by top-k/p, min-p."""
        greedy = logits.argmax(dim=-1)
        if batch.all_greedy:
            return greedy
        scaled = scale_by_temperature(logits, batch)
        noise = self._exponential_noise(scaled, seqs, batch)
        if not batch.drawn_masks:                  # greedy rows take `greedy` below
            sampled = (scaled.softmax(dim=-1) / noise).argmax(dim=-1)
        elif batch.drawn_all_top_k:
            sampled = _sample_among_top_k(scaled, noise, batch)
        else:                                      # some row masks the whole vocabulary: one threshold per row
            masked = apply_top_k_top_p_min_p(scaled, *_mask_params(batch, scaled.device), self.threshold)
            sampled = (masked.softmax(dim=-1) / noise).argmax(dim=-1)
        return torch.where(to_device(batch.greedy, torch.bool, logits.device), greedy, sampled)

    def _exponential_noise(self, like: torch.Tensor, seqs: list[Sequence], batch: SamplingBatch) -> torch.Tensor:
        """One variate per vocabulary entry and row, whatever path samples the row, so that a
        seeded row draws the same numbers in any batch."""
        noise = torch.empty_like(like).exponential_(generator=self.generator)
        for row in np.flatnonzero(~batch.greedy):
            if seqs[row].generator is not None:
                noise[row].exponential_(generator=seqs[row].generator)
        return noise


class LogprobTensors(NamedTuple):
    """Log-probabilities of N chosen tokens, as tensors (on the device until read back)."""
    token_ids: torch.Tensor      # [N]
    logprobs: torch.Tensor       # [N] of the chosen tokens
    ranks: torch.Tensor          # [N] 1 = the most likely token
    top_ids: torch.Tensor        # [N, K] the K most likely tokens
    top_logprobs: torch.Tensor   # [N, K]


def logprob_tensors(logits: torch.Tensor, token_ids: torch.Tensor, num_top: int) -> LogprobTensors:
    """Log-probabilities of `token_ids` under softmax(logits) ([N, V]) and the top `num_top` of each row."""
    logprobs = logits.float().log_softmax(dim=-1)
    chosen = logprobs.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    ranks = (logprobs > chosen.unsqueeze(-1)).sum(dim=-1) + 1
    top_logprobs, top_ids = logprobs.topk(num_top, dim=-1)
    return LogprobTensors(token_ids, chosen, ranks, top_ids, top_logprobs)


def token_logprobs(tensors: LogprobTensors, num_top: list[int]) -> list[TokenLogprobs]:
    """One TokenLogprobs per row of host tensors, row i with its top `num_top[i]`."""
    token_ids, chosen, ranks, top_ids, top_values = (t.tolist() for t in tensors)
    return [TokenLogprobs(token_ids[row], chosen[row], ranks[row],
                          list(zip(top_ids[row][:count], top_values[row][:count])))
            for row, count in enumerate(num_top)]


def compute_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, num_top: list[int]) -> list[TokenLogprobs]:
    """Log-probabilities of `token_ids` under softmax(logits), with each row's top `num_top[i]`."""
    return token_logprobs(logprob_tensors(logits, token_ids, max(num_top, default=0)), num_top)
