"""Decode steps replayed as CUDA graphs at the artifact's capture sizes.

A decode batch of n sequences runs as the graph of the smallest capture size s >= n: the inputs
are copied into static buffers and the s - n padding sequences are made harmless (their KV slot
is -1, so nothing is written; they attend over one token of block 0, and their logits are
dropped). Graphs share one memory pool and are captured largest first, as the build measured.
"""
from __future__ import annotations

import bisect
import logging

import torch

log = logging.getLogger("atom_aot")


class DecodeGraphs:
    def __init__(self, forward, kv_cache: torch.Tensor, capture_sizes: tuple[int, ...], max_blocks_per_seq: int):
        self.forward = forward
        self.kv_cache = kv_cache
        self.sizes = sorted(capture_sizes)
        device, biggest = kv_cache.device, self.sizes[-1]
        i32 = dict(dtype=torch.int32, device=device)
        self.input_ids = torch.zeros(biggest, dtype=torch.int64, device=device)
        self.positions = torch.zeros(biggest, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((biggest,), -1, dtype=torch.int64, device=device)
        self.block_tables = torch.zeros(biggest, max_blocks_per_seq, **i32)
        self.seq_lens = torch.ones(biggest, **i32)
        self.query_start_loc = torch.arange(biggest + 1, **i32)   # one token per sequence: always 0..n
        self.logits_indices = torch.arange(biggest, dtype=torch.int64, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None

    def _call(self, size: int) -> torch.Tensor:
        return self.forward(self.input_ids[:size], self.positions[:size], self.kv_cache, self.slot_mapping[:size],
                            self.block_tables[:size], self.seq_lens[:size], self.query_start_loc[:size + 1],
                            self.logits_indices[:size])

    @torch.inference_mode()
    def capture(self) -> None:
        for size in reversed(self.sizes):
            self._call(size)                     # warm-up: workspaces and handles outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                self.outputs[size] = self._call(size)
            self.pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def fits(self, num_seqs: int) -> bool:
        return num_seqs <= self.sizes[-1]

    def __call__(self, input_ids, positions, kv_cache, slot_mapping, block_tables, seq_lens, query_start_loc,
                 logits_indices) -> torch.Tensor:
        n = input_ids.shape[0]
        size = self.sizes[bisect.bisect_left(self.sizes, n)]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(slot_mapping)
        self.slot_mapping[n:size].fill_(-1)
        self.block_tables[:n, :block_tables.shape[1]].copy_(block_tables)
        self.seq_lens[:n].copy_(seq_lens)
        self.seq_lens[n:size].fill_(1)
        self.graphs[size].replay()
        return self.outputs[size][:n]
