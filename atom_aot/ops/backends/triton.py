"""The `triton` attention backend (CUDA and ROCm arches): one fused kernel for QK-norm + rope + the
KV-cache write, then paged attention, each launched with the config the build measured.

Constructing it imports atom_aot.ops.triton, which registers the `atom_triton::` ops (and needs
triton); nothing on the CPU path does.
"""
from __future__ import annotations

import torch

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.ops.backends.base import AttentionArgs, launch_configs


class TritonAttention:
    def __init__(self, choice: BackendChoice):
        import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::*)
        from atom_aot.ops.triton.paged_attention import AttentionConfig
        from atom_aot.ops.triton.rope_cache import RopeCacheConfig
        configs = launch_configs(choice, {"qk_norm_rope_cache_write": RopeCacheConfig,
                                        "paged_attention": AttentionConfig})
        self.rope_cache_args = configs["qk_norm_rope_cache_write"].as_args()   # block_h, num_warps
        self.attention_args = configs["paged_attention"].as_args()   # AttentionConfig's fields, in order

    def __call__(self, args: AttentionArgs) -> torch.Tensor:
        ops, step, norm = torch.ops.atom_triton, args.inputs, args.qk_norm
        q = ops.qk_norm_rope_cache_write(
            args.q, args.k, args.v, args.positions, args.cos_sin_cache,
            norm.q_weight if norm else None, norm.k_weight if norm else None, norm.eps if norm else 0.0,
            step.kv_cache, args.layer, step.slot_mapping, *self.rope_cache_args, args.kv_scale)
        return ops.paged_attention(q, step.kv_cache, args.layer, step.block_tables, step.seq_lens,
                                   step.query_start_loc, args.scale, *self.attention_args, args.kv_scale,
                                   args.sinks, args.sliding_window)
