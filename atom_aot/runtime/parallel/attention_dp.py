"""Data-parallel attention at serve time (`atom-build -dp N --ep`): every rank is an engine core of
its own, with its own requests, scheduler and KV cache, and the ranks meet only in the expert
layers, which gather every rank's tokens (models/moe.py SparseMoeBlock). So the ranks must step
together, and every step's forward must have the same token count on every rank:

- `Lockstep.agree` (once per engine-loop turn, on the control group): does any rank have work, does
  any want to stop. A rank with nothing to run while others do runs a step of padding only.
- `AlignedForwards` (once per step, on the control group): the ranks take the largest token count
  any of them runs, and each pads its batch to it with one-token sequences whose KV slot is -1
  (written nowhere, logits not asked for), as CUDA-graph padding does. Speculative verify steps are such
  steps too (one forward each, decode rows or the mixed package).
- `AlignedMTP` (--method mtp): the MTP layer's steps after each target step, K on every rank (the proposer's
  first over the step's positions, then K - 1 chained ones), each of the largest row count any rank runs; a rank
  with fewer, or none, runs padding-only ones (`Lockstep.step` makes up its count at the end of the step).

The front end starts the N engine processes with torchrun's variables (runtime/processes/data_parallel.py); vLLM's
DP engines do the same per-step token-count exchange and dummy batches.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch
import torch.distributed as dist

from atom_aot.artifact.reader import Artifact
from atom_aot.distributed.group import RankGroup, RankPlace, leave, rank_device
from atom_aot.errors import RankStopped, StartupError
from atom_aot.models.step_inputs import StepInputs, input_dtype
from atom_aot.runtime.execution.forwards import Forward, Forwards
from atom_aot.runtime.scheduling.scheduled_batch import ScheduledBatch
from atom_aot.runtime.spec.mtp import MTPForward

log = logging.getLogger("atom_aot")


def attention_dp_place(artifact: Artifact) -> tuple[RankPlace, torch.device]:
    """This engine process's place among the artifact's data-parallel ranks (from torchrun's variables,
    which the server's front end sets for each engine process it starts), and its device, made current;
    `group.join` meets the others there."""
    from atom_aot.runtime.loading.loader import check_target
    check_target(artifact)                 # refuse before meeting the other ranks
    artifact_path, world_size = artifact.path, artifact.manifest.layout.world_size
    place = RankPlace.from_env()
    if place is None:
        raise StartupError(
            f"{artifact_path} was built with data-parallel attention over {world_size} ranks (-dp {world_size} --ep): "
            f"it runs as {world_size} engine cores, one per rank, each with its own requests, in processes placed by "
            f"torchrun's variables: `atom-run {artifact_path} serve` and the offline LLMEngine start them and "
            f"balance requests across them")
    if place.world_size != world_size:
        raise StartupError(f"WORLD_SIZE is {place.world_size}, but the artifact has {world_size} data-parallel ranks")
    return place, rank_device(artifact.manifest.target.arch, place.local_rank)


def agree(values: list[int], group: RankGroup, op=dist.ReduceOp.MAX) -> list[int]:
    """Every rank's `values` reduced element-wise over the ranks (on the control group, host memory)."""
    t = torch.tensor(values, dtype=torch.int64)
    try:
        dist.all_reduce(t, op=op, group=group.control)
    except (dist.DistError, RuntimeError) as e:      # gloo says "Connection closed by peer" as a RuntimeError
        raise RankStopped(f"data-parallel rank {group.rank} lost another rank ({type(e).__name__}: {e}); the "
                          f"ranks step together, so this engine stops") from None
    return t.tolist()


def pad_to(inputs: StepInputs, num_tokens: int) -> StepInputs:
    """`inputs` with one-token padding sequences appended up to `num_tokens` tokens: token 0 at position 0,
    KV slot -1 (nothing written), attending over one token of block 0; no logits row is added."""
    pad = num_tokens - inputs.input_ids.shape[0]
    if pad <= 0:
        return inputs

    def extended(t: torch.Tensor, fill: int) -> torch.Tensor:
        return torch.cat([t, t.new_full((pad, *t.shape[1:]), fill)])

    starts = inputs.query_start_loc
    more = starts[-1] + torch.arange(1, pad + 1, dtype=starts.dtype, device=starts.device)
    return inputs._replace(input_ids=extended(inputs.input_ids, 0), positions=extended(inputs.positions, 0),
                           slot_mapping=extended(inputs.slot_mapping, -1),
                           block_tables=extended(inputs.block_tables, 0), seq_lens=extended(inputs.seq_lens, 1),
                           query_start_loc=torch.cat([starts, more]))


def padding_only(kv_cache: torch.Tensor, num_tokens: int) -> StepInputs:
    """A step of `num_tokens` padding sequences and nothing else (a rank with no work while others step)."""
    def tensor(name: str, values) -> torch.Tensor:
        return torch.as_tensor(values, dtype=input_dtype(name, kv_cache.dtype)).to(kv_cache.device)
    n = num_tokens
    return StepInputs(input_ids=tensor("input_ids", [0] * n), positions=tensor("positions", [0] * n),
                      kv_cache=kv_cache, slot_mapping=tensor("slot_mapping", [-1] * n),
                      block_tables=tensor("block_tables", [[0]] * n), seq_lens=tensor("seq_lens", [1] * n),
                      query_start_loc=tensor("query_start_loc", list(range(n + 1))),
                      logits_indices=tensor("logits_indices", []))


class AlignedForwards:
    """`Forwards` whose every call first agrees the step's token count with the other ranks and pads
    to it. A decode batch runs the decode path when the agreed count is one of its CUDA graphs' sizes
    (or, without graphs, its own count: the decode package samples every token, padding included),
    else the mixed package, which takes any count and samples only the rows asked for."""

    def __init__(self, forwards: Forwards, group: RankGroup, kv_cache: torch.Tensor):
        self.forwards = forwards
        self.group = group
        self.kv_cache = kv_cache
        self.graph_sizes: list[int] | None = getattr(forwards.decode, "sizes", None)   # DecodeGraphs'
        self.steps_run = 0           # forwards run by this rank, padding-only steps included

    def for_batch(self, batch: ScheduledBatch) -> Forward:
        chosen = self.forwards.for_batch(batch)
        return lambda inputs: self._run(inputs, decode=chosen is self.forwards.decode and chosen is not None)

    @property
    def mixed(self) -> Forward:
        """The mixed package's forward, aligned (a speculative verify step through the mixed package)."""
        return lambda inputs: self._run(inputs, decode=False)

    @property
    def decode(self) -> Forward | None:
        """The decode path's forward, aligned (a verify step as decode rows): its graphs at a size the ranks
        agreed, else the mixed package, as `for_batch` picks; None where the artifact has no decode package."""
        return None if self.forwards.decode is None else (lambda inputs: self._run(inputs, decode=True))

    @property
    def decode_max_seqs(self) -> int | None:
        return self.forwards.decode_max_seqs

    def idle_step(self) -> None:
        """This rank's part of a step in which it has nothing to run."""
        (target,) = agree([0], self.group)
        self.steps_run += 1
        if target:
            self._forward(padding_only(self.kv_cache, target), decode=self._decodes_at(target))

    def _run(self, inputs: StepInputs, decode: bool) -> torch.Tensor:
        tokens = inputs.input_ids.shape[0]
        own = self._graph_size(tokens) if decode and self.graph_sizes else tokens
        (target,) = agree([own], self.group)
        self.steps_run += 1
        num_logits = inputs.logits_indices.shape[0]
        decode = decode and (target == tokens if self.graph_sizes is None else target in self.graph_sizes)
        return self._forward(pad_to(inputs, target), decode)[:num_logits]

    def _forward(self, inputs: StepInputs, decode: bool) -> torch.Tensor:
        forward: Callable = self.forwards.decode if decode else self.forwards.mixed
        return forward(inputs)

    def _decodes_at(self, tokens: int) -> bool:
        """Whether a padding-only step of `tokens` runs a decode graph (else the mixed package)."""
        return self.graph_sizes is not None and tokens in self.graph_sizes

    def _graph_size(self, tokens: int) -> int:
        return next(size for size in self.graph_sizes if size >= tokens)


class AlignedMTP:
    """The MTP layer's step (runtime/spec/mtp.py) on a data-parallel-attention rank: each call takes the largest row
    count any rank's call of the same turn has and pads to it (rows of token 0 at position 0, slot -1, zero hidden
    states), so the expert layer's gather inside the step meets the others'. Every rank makes `calls_per_step`
    calls per engine step (`finish_step` makes up the rest with padding); a call that no rank has rows for runs
    nothing."""

    def __init__(self, mtp: MTPForward, group: RankGroup, kv_cache: torch.Tensor, hidden_size: int,
                 dtype: torch.dtype, calls_per_step: int):
        self.mtp, self.group, self.kv_cache = mtp, group, kv_cache
        self.hidden_size, self.dtype = hidden_size, dtype
        self.calls_per_step = calls_per_step
        self.calls = 0                 # made in this engine step

    def __call__(self, inputs: StepInputs, previous_hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self._count()
        rows = inputs.input_ids.shape[0]
        (target,) = agree([rows], self.group)
        padding = previous_hidden.new_zeros(target - rows, self.hidden_size)
        logits, hidden = self.mtp(pad_to(inputs, target), torch.cat([previous_hidden, padding]))
        return logits[:inputs.logits_indices.shape[0]], hidden[:rows]

    def finish_step(self) -> None:
        """This rank's part of the MTP calls of the step that it did not make."""
        while self.calls < self.calls_per_step:
            self._count()
            (target,) = agree([0], self.group)
            if target:
                padding = torch.zeros(target, self.hidden_size, dtype=self.dtype, device=self.kv_cache.device)
                self.mtp(padding_only(self.kv_cache, target), padding)
        self.calls = 0

    def _count(self) -> None:
        self.calls += 1
        if self.calls > self.calls_per_step:
            raise RuntimeError(f"the MTP proposer made more than {self.calls_per_step} calls in one engine step: the "
                               f"data-parallel ranks' MTP steps would not meet")


class Lockstep:
    """The engine loop's side: one agreement per turn on whether the ranks step and whether they stop."""

    def __init__(self, forwards: AlignedForwards):
        self.forwards = forwards
        self.mtp: AlignedMTP | None = None

    def align_mtp(self, mtp: MTPForward, hidden_size: int, dtype: torch.dtype, calls_per_step: int) -> AlignedMTP:
        """The MTP step of --method mtp, aligned with the other ranks' (each engine step's count made up here)."""
        self.mtp = AlignedMTP(mtp, self.forwards.group, self.forwards.kv_cache, hidden_size, dtype, calls_per_step)
        return self.mtp

    def agree(self, busy: bool, stop: bool) -> tuple[bool, bool]:
        """(any rank has work, any rank stops)."""
        any_busy, any_stop = agree([int(busy), int(stop)], self.forwards.group)
        return bool(any_busy), bool(any_stop)

    def step(self, step: Callable[[], list], has_work: bool) -> list:
        """Run this rank's step (`step`, when it has work) and, if that ran no forward, a padding-only one."""
        before = self.forwards.steps_run
        outputs = step() if has_work else []
        if self.forwards.steps_run == before:
            self.forwards.idle_step()
        if self.mtp is not None:
            self.mtp.finish_step()
        return outputs

    def close(self) -> None:
        leave()
