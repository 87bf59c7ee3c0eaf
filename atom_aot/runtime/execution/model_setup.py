"""A rank's KV cache and forwards: what every tensor-parallel rank makes once it has loaded (rank 0 and the
others alike): the cache tensor, and the decode package replayed as CUDA graphs or as it is."""
from __future__ import annotations

import logging
import time

import torch

from atom_aot.artifact.phase import Phase
from atom_aot.errors import StartupError
from atom_aot.runtime.config import RuntimeConfig
from atom_aot.runtime.execution.forwards import Forwards
from atom_aot.runtime.execution.kv_cache import allocate_kv_cache
from atom_aot.runtime.execution.memory import uses_graphs
from atom_aot.runtime.loading.loader import LoadedArtifact

log = logging.getLogger("atom_aot")


def make_forwards(loaded: LoadedArtifact, config: RuntimeConfig, kv_cache, max_model_len: int) -> Forwards:
    """The mixed forward, and the decode package replayed as CUDA graphs (captured here) or as it is."""
    mixed, decode = loaded.forwards[Phase.MIXED], loaded.forwards.get(Phase.DECODE)
    if not uses_graphs(loaded, config):
        log.info("decode steps: %s", "the decode package" if decode is not None else "the same path as prefill")
        return Forwards(mixed, decode)
    from atom_aot.runtime.execution.cuda_graphs import DecodeGraphs
    start = time.perf_counter()
    # a package that also returns the hidden states (MTP layers) keeps them in its graphs, for MTP's verify rows
    forward = decode.logits_and_hidden if getattr(decode, "returns_hidden", False) else decode
    graphs = DecodeGraphs(forward, kv_cache, loaded.graph_plan.capture_sizes, -(-max_model_len // loaded.block_size))
    graphs.capture()
    loaded.timings["graph capture"] = time.perf_counter() - start
    log.info("decode steps: CUDA graphs of the decode package, %d sizes up to %d captured in %.2fs",
             len(graphs.sizes), graphs.max_batch_size, loaded.timings["graph capture"])
    return Forwards(mixed, graphs, decode_max_seqs=graphs.max_batch_size)


def prepare_model(loaded: LoadedArtifact, config: RuntimeConfig, num_blocks: int) -> tuple[torch.Tensor, Forwards]:
    """This rank's KV cache and forwards (every tensor-parallel rank runs this, rank 0 and the others alike)."""
    max_model_len = config.served_max_model_len(loaded.max_model_len)
    blocks_per_seq = -(-max_model_len // loaded.block_size)
    if num_blocks < blocks_per_seq:
        raise StartupError(
            f"the KV cache holds {num_blocks} blocks of {loaded.block_size} tokens, fewer than the "
            f"{blocks_per_seq} that one sequence of max_model_len={max_model_len} needs. Give the cache more "
            f"memory (kv_cache_memory_bytes / gpu_memory_utilization) or lower max_model_len.")
    kv_cache = allocate_kv_cache(loaded.kv_cache, num_blocks, loaded.block_size, loaded.device)
    log.info("KV cache: %d blocks x %d tokens (%.1f MiB, %s)", num_blocks, loaded.block_size,
             kv_cache.numel() * kv_cache.element_size() / 2**20, loaded.kv_cache.describe())
    return kv_cache, make_forwards(loaded, config, kv_cache, max_model_len)
