"""Decode steps replayed as CUDA graphs at the artifact's capture sizes.

A decode batch of n sequences runs as the graph of the smallest capture size s >= n: the inputs
are copied into static buffers and the s - n padding sequences are made harmless (their KV slot
is -1, so nothing is written; they attend over one token, and their logits are dropped). Graphs
share one memory pool and are captured largest first, as the build measured.

The staging into static buffers (`StaticDecodeInputs`) and the capture are apart, so the first
runs on the CPU too (tests record the forward as a plain call instead of a graph).
"""
from __future__ import annotations

import bisect
import functools
import weakref
from typing import Callable

import torch

from atom_aot.artifact.signature import INPUT_NAMES, STEP_INPUTS
from atom_aot.distributed.group import before_leaving
from atom_aot.models.step_inputs import StepInputs, input_dtype

Outputs = torch.Tensor | tuple[torch.Tensor, ...]
Replay = Callable[[], Outputs]

# What the s - n padding rows hold. Inputs not listed keep their last values (token ids, positions
# and block tables of an earlier batch: valid indices whose results are dropped).
PADDING = {"slot_mapping": -1,   # nothing is written to the cache
           "seq_lens": 1}        # attend over one token of the row's first block
# The same for every decode batch (one token per sequence, each sampled), so never copied.
FIXED = ("kv_cache", "query_start_loc", "logits_indices")


def graph_view(buffers: StepInputs, size: int, rows_per_seq: int = 1) -> StepInputs:
    """The inputs of the graph of `size` sequences of `rows_per_seq` token rows each: leading slices of
    the static buffers by each input's first dimension (the KV cache passed whole)."""
    extent = {"num_tokens": size * rows_per_seq, "num_logits": size * rows_per_seq, "num_seqs": size,
              "num_seqs_plus_1": size + 1}
    return StepInputs(*(buf[:extent[spec.dims[0]]] if spec.dims[0] in extent else buf
                        for spec, buf in zip(STEP_INPUTS, buffers)))


def static_buffer(name: str, *shape: int, kv_cache: torch.Tensor, fill: int = 0) -> torch.Tensor:
    """A static input buffer of the step input `name`, in its dtype, on the cache's device."""
    return torch.full(shape, fill, dtype=input_dtype(name, kv_cache.dtype), device=kv_cache.device)


def smallest_size(sizes: list[int], num_seqs: int) -> int:
    """The smallest capture size (of `sizes`, increasing) that holds `num_seqs` sequences."""
    return sizes[bisect.bisect_left(sizes, num_seqs)]


def record_sizes(sizes: list[int], forward_at: Callable[[int], object],
                 record: Callable[[Replay], Replay] | None = None) -> dict[int, Replay]:
    """Each size's replay, recorded largest first; `record` turns a call into its replay (default: a
    CUDA graph, all sharing one pool)."""
    record = record or CudaGraphRecorder()
    return {size: record(functools.partial(forward_at, size)) for size in reversed(sizes)}


class StaticDecodeInputs:
    """The static buffers the graphs read, sized for the largest capture size."""

    def __init__(self, kv_cache: torch.Tensor, capture_sizes: tuple[int, ...], max_blocks_per_seq: int):
        self.sizes = sorted(capture_sizes)
        biggest, device = self.sizes[-1], kv_cache.device
        buffer = functools.partial(static_buffer, kv_cache=kv_cache)
        self.buffers = StepInputs(
            input_ids=buffer("input_ids", biggest), positions=buffer("positions", biggest), kv_cache=kv_cache,
            slot_mapping=buffer("slot_mapping", biggest, fill=PADDING["slot_mapping"]),
            block_tables=buffer("block_tables", biggest, max_blocks_per_seq),
            seq_lens=buffer("seq_lens", biggest, fill=PADDING["seq_lens"]),
            query_start_loc=torch.arange(biggest + 1, dtype=input_dtype("query_start_loc", kv_cache.dtype),
                                         device=device),
            logits_indices=torch.arange(biggest, dtype=input_dtype("logits_indices", kv_cache.dtype), device=device))

    @property
    def max_batch_size(self) -> int:
        return self.sizes[-1]

    def size_for(self, num_seqs: int) -> int:
        return smallest_size(self.sizes, num_seqs)

    def view(self, size: int) -> StepInputs:
        """The inputs of the graph of `size`: leading slices of the buffers."""
        return graph_view(self.buffers, size)

    def load(self, inputs: StepInputs) -> int:
        """Copies a decode batch of n sequences into the buffers, pads rows n .. size; returns the size."""
        if inputs.kv_cache is not self.buffers.kv_cache:
            raise ValueError("the decode graphs were captured on another KV cache than this batch's")
        n = inputs.input_ids.shape[0]
        size = self.size_for(n)
        for name in INPUT_NAMES:
            if name in FIXED:
                continue
            source, static = getattr(inputs, name), getattr(self.buffers, name)
            static[tuple(slice(0, extent) for extent in source.shape)].copy_(source)
            if name in PADDING:
                static[n:size].fill_(PADDING[name])
        return size


# Every graph this process captured, so that a rank leaving its process group can free them first.
_captured: "weakref.WeakSet[torch.cuda.CUDAGraph]" = weakref.WeakSet()


def release_captured_graphs() -> None:
    """Free every CUDA graph this process captured (they cannot be replayed after). NCCL's communicator
    destroy waits forever on graphs that captured its collectives (pytorch/pytorch#115388): a TP-2 engine on
    two H100s never exited. Every leave() of the process group runs it first."""
    graphs = list(_captured)
    if graphs and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    for graph in graphs:
        graph.reset()
    _captured.clear()


before_leaving(release_captured_graphs)


class CudaGraphRecorder:
    """Captures calls as CUDA graphs that share one memory pool."""

    def __init__(self):
        self.pool = None

    def __call__(self, call: Replay) -> Replay:
        call()                       # warm-up: workspaces and handles outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = call()
        _captured.add(graph)
        self.pool = graph.pool()
        torch.cuda.synchronize()

        def replay() -> torch.Tensor:
            graph.replay()
            return output
        return replay


class DecodeGraphs:
    """`forward` returns the logits, or (logits, hidden states) for a model with MTP layers (the package's
    `logits_and_hidden`): the graphs keep what it returns, the model runner's call gets the logits."""

    def __init__(self, forward: Callable[[StepInputs], Outputs], kv_cache: torch.Tensor,
                 capture_sizes: tuple[int, ...], max_blocks_per_seq: int):
        self.forward = forward
        self.static = StaticDecodeInputs(kv_cache, capture_sizes, max_blocks_per_seq)
        self.replays: dict[int, Replay] = {}

    @property
    def sizes(self) -> list[int]:
        return self.static.sizes

    @property
    def max_batch_size(self) -> int:
        return self.static.max_batch_size

    def forward_at(self, size: int) -> Outputs:
        """The forward on the static inputs of `size`: what a graph records."""
        return self.forward(self.static.view(size))

    @torch.inference_mode()
    def capture(self, record: Callable[[Replay], Replay] | None = None) -> None:
        """Records every size, largest first; `record` turns a call into its replay (default: a CUDA graph)."""
        self.replays = record_sizes(self.sizes, self.forward_at, record)

    def outputs(self, inputs: StepInputs) -> Outputs:
        """All the forward returns, at the batch's n rows."""
        n = inputs.input_ids.shape[0]
        out = self.replays[self.static.load(inputs)]()
        return tuple(t[:n] for t in out) if isinstance(out, tuple) else out[:n]

    def __call__(self, inputs: StepInputs) -> torch.Tensor:
        out = self.outputs(inputs)
        return out[0] if isinstance(out, tuple) else out

    def logits_and_hidden(self, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.outputs(inputs)
        if not isinstance(out, tuple):
            raise TypeError("these decode graphs were captured on a forward that returns no hidden states")
        return out
