"""Each step's inputs, from rank 0 (which schedules) to the other ranks (which only compute).

Before rank 0 runs a forward it broadcasts a header on the control group (host memory), then the
step's index tensors, packed into one int64 tensor, on the world group (on the device: NCCL on GPUs).
Every rank then runs the same forward on the same inputs, each with its own KV cache and weights;
the collectives inside the forward meet. The KV cache is not sent: each rank's is its own.

    header: [command, forward, num_tokens, num_seqs, max_blocks_per_seq, num_logits]

The forwards are the mixed package (0), the decode one (1) and, for --method mtp, the MTP layer's step (2),
which also takes the previous positions' hidden states [num_tokens, hidden]: rank 0 broadcasts them after the
inputs (the ranks' own are the same numbers, as every rank's residual stream is all-reduced, but a broadcast needs
no proposer on the other ranks to know which rows a step reads).

Between steps rank 0 may also tell the others to start or stop their profiler (runtime/profiler.py):
    header: [PROFILE_START, path bytes, first rank, more, 0, 0], then the trace root's bytes (uint8);
    header: [PROFILE_STOP, 0, ...];
every rank answers each of them with whether it did it (an all_gather on the control group).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch
import torch.distributed as dist

from atom_aot.distributed.group import RankGroup
from atom_aot.models.step_inputs import SPECS, StepInputs, input_dtype

STEP, STOP, PROFILE_START, PROFILE_STOP = 0, 1, 2, 3
MIXED_FORWARD, DECODE_FORWARD, MTP_FORWARD = 0, 1, 2
SENT = tuple(name for name in StepInputs._fields if name != "kv_cache")
HEADER_LEN = 6
# Each input starts at a multiple of 8 int64 elements (64 bytes) of the packed tensor: the receiving ranks'
# inputs are views of it, and a compiled package copies any input less aligned than it was compiled for (16
# bytes) on every call ("Input 7 was compiled as 16-bytes aligned ..." on rank 1, two H100s).
ALIGN_ELEMENTS = 8


def _padded(numel: int) -> int:
    return -(-numel // ALIGN_ELEMENTS) * ALIGN_ELEMENTS


def _sizes(header: list[int]) -> dict[str, int]:
    tokens, seqs, max_blocks, logits = header[2:]
    return {"num_tokens": tokens, "num_seqs": seqs, "num_seqs_plus_1": seqs + 1, "max_blocks_per_seq": max_blocks,
            "num_logits": logits}


def pack(inputs: StepInputs) -> torch.Tensor:
    """[sum of the sent inputs' padded sizes] int64: the sent inputs flattened, back to back, each padded to a
    multiple of ALIGN_ELEMENTS. The padding is never read (unpack slices it off), so it is left unfilled: no
    fill kernel on each step."""
    parts = [getattr(inputs, name).flatten().to(torch.int64) for name in SENT]
    padding = parts[0].new_empty(ALIGN_ELEMENTS)
    return torch.cat([piece for part in parts for piece in (part, padding[:_padded(part.numel()) - part.numel()])])


def unpack(flat: torch.Tensor, sizes: dict[str, int], kv_cache: torch.Tensor) -> StepInputs:
    shapes = {name: [sizes[dim] for dim in SPECS[name].dims] for name in SENT}
    numels = [_numel(SPECS[name].dims, sizes) for name in SENT]
    parts = flat.split([_padded(n) for n in numels])
    values = {name: part[:n].view(shapes[name]).to(input_dtype(name, kv_cache.dtype))
              for name, part, n in zip(SENT, parts, numels)}
    return StepInputs(kv_cache=kv_cache, **values)


class StepSender:
    """Rank 0's end."""

    def __init__(self, group: RankGroup):
        self.group = group

    def send(self, forward: int, inputs: StepInputs, *tensors: torch.Tensor) -> None:
        """`tensors`: what the forward takes after its inputs (an MTP step's previous hidden states)."""
        (tokens,), (seqs, max_blocks) = inputs.input_ids.shape, inputs.block_tables.shape
        header = torch.tensor([STEP, forward, tokens, seqs, max_blocks, inputs.logits_indices.shape[0]])
        dist.broadcast(header, src=0, group=self.group.control)
        dist.broadcast(pack(inputs), src=0)
        for tensor in tensors:
            dist.broadcast(tensor.contiguous(), src=0)

    def stop(self) -> None:
        dist.broadcast(torch.tensor([STOP] + [0] * (HEADER_LEN - 1)), src=0, group=self.group.control)

    def profile_start(self, root: str, first_rank: int, more: bool) -> None:
        path = torch.tensor(list(root.encode()), dtype=torch.uint8)
        header = torch.tensor([PROFILE_START, path.numel(), first_rank, int(more), 0, 0])
        dist.broadcast(header, src=0, group=self.group.control)
        dist.broadcast(path, src=0, group=self.group.control)

    def profile_stop(self) -> None:
        dist.broadcast(torch.tensor([PROFILE_STOP] + [0] * (HEADER_LEN - 1)), src=0, group=self.group.control)

    def failed_ranks(self) -> list[int]:
        """The ranks whose answer to the last profile command says they could not do it."""
        return [rank for rank, ok in enumerate(_answers(True, self.group)) if not ok]


@dataclass(frozen=True)
class ProfileCommand:
    """Start (with where the traces go) or stop this rank's profiler; answered with `StepReceiver.answer`."""
    start: bool
    root: str = ""                 # start: traces go to root/rank_<first_rank + this rank>/
    first_rank: int = 0
    more: bool = False             # start: also shapes, stacks and memory


class StepReceiver:
    """The end of ranks 1..N-1. `hidden`: (hidden size, dtype) of the states an MTP step takes (None: the
    engine runs no MTP steps)."""

    def __init__(self, group: RankGroup, kv_cache: torch.Tensor, hidden: tuple[int, torch.dtype] | None = None):
        self.group = group
        self.kv_cache = kv_cache
        self.hidden = hidden

    def receive(self) -> tuple[int, tuple] | ProfileCommand | None:
        """(which forward, its arguments: the inputs, then an MTP step's previous hidden states), a profiler
        command, or None when rank 0 stops the engine."""
        header = torch.empty(HEADER_LEN, dtype=torch.int64)
        dist.broadcast(header, src=0, group=self.group.control)
        values = header.tolist()
        if values[0] == STOP:
            return None
        if values[0] == PROFILE_STOP:
            return ProfileCommand(start=False)
        if values[0] == PROFILE_START:
            path = torch.empty(values[1], dtype=torch.uint8)
            dist.broadcast(path, src=0, group=self.group.control)
            return ProfileCommand(True, bytes(path.tolist()).decode(), values[2], bool(values[3]))
        sizes = _sizes(values)
        flat = torch.empty(sum(_padded(_numel(SPECS[name].dims, sizes)) for name in SENT), dtype=torch.int64,
                           device=self.kv_cache.device)
        dist.broadcast(flat, src=0)
        inputs = unpack(flat, sizes, self.kv_cache)
        if values[1] != MTP_FORWARD:
            return values[1], (inputs,)
        if self.hidden is None:
            raise RuntimeError("rank 0 sent an MTP step, but this rank was started without --method mtp")
        size, dtype = self.hidden
        previous = torch.empty(sizes["num_tokens"], size, dtype=dtype, device=self.kv_cache.device)
        dist.broadcast(previous, src=0)
        return MTP_FORWARD, (inputs, previous)

    def answer(self, ok: bool) -> None:
        """This rank's answer to the profile command it received: whether it did it."""
        _answers(ok, self.group)


def _answers(ok: bool, group: RankGroup) -> list[bool]:
    """Every rank's answer to a profile command, by rank."""
    answers = [torch.zeros(1, dtype=torch.int64) for _ in range(group.world_size)]
    dist.all_gather(answers, torch.tensor([int(ok)]), group=group.control)
    return [bool(a.item()) for a in answers]


def _numel(dims: tuple[str, ...], sizes: dict[str, int]) -> int:
    return int(torch.Size([sizes[d] for d in dims]).numel())


class StepLead(Protocol):
    """What a leading forward needs of rank 0's link to the others (runtime/parallel/tp_lead.py LeadRank)."""
    sender: StepSender

    def check(self, error: BaseException | None) -> None:
        """Raise, naming the rank, if one is known dead or `error` (a failed collective) says so."""


class LeadingForward:
    """Rank 0's forward: sends the inputs (and an MTP step's previous hidden states) to the other ranks, then
    runs the forward itself.

    `lead` sends, and says which rank failed when a collective fails."""

    def __init__(self, forward: Callable, index: int, lead: StepLead):
        self.forward, self.index, self.lead = forward, index, lead

    def __call__(self, inputs: StepInputs, *tensors: torch.Tensor):
        self.lead.check(None)
        try:
            self.lead.sender.send(self.index, inputs, *tensors)
            return self.forward(inputs, *tensors)
        except RuntimeError as e:       # torch.distributed's errors (DistBackendError, ...) are RuntimeErrors
            self.lead.check(e)
            raise
