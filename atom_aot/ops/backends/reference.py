"""The `reference` attention backend: plain torch QK-norm and rope, then the `atom::paged_attention`
op (cache write + attention). What the CPU arch runs, and what the fast backends are checked against."""
from __future__ import annotations

import torch

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.ops.attention import paged_attention
from atom_aot.ops.backends.base import AttentionArgs, launch_configs
from atom_aot.ops.norm import rms_norm
from atom_aot.ops.rope import apply_rope


class ReferenceAttention:
    def __init__(self, choice: BackendChoice):
        launch_configs(choice, {})     # nothing to tune

    def __call__(self, args: AttentionArgs) -> torch.Tensor:
        q, k = args.q, args.k
        if args.qk_norm is not None:
            q = rms_norm(q, args.qk_norm.q_weight, args.qk_norm.eps)
            k = rms_norm(k, args.qk_norm.k_weight, args.qk_norm.eps)
        q, k = apply_rope(args.positions, q, k, args.cos_sin_cache)
        step = args.inputs
        return paged_attention(q, k, args.v, step.kv_cache, args.layer, step.slot_mapping, step.block_tables,
                               step.seq_lens, step.query_start_loc, args.scale, args.kv_scale, args.sinks,
                               args.sliding_window)
