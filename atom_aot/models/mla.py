"""Multi-head latent attention's projections (DeepSeek-V2/V3): q (optionally through a LoRA),
the compressed kv latent and its decoupled rope part, and the per-head up-projections W_UK / W_UV
that the build splits out of kv_b_proj. The attention itself runs through the MLA backend the
tuning row names (atom_aot/ops/backends/mla.py; layout in atom_aot/ops/mla.py)."""
from __future__ import annotations

import torch
from torch import nn

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.models.config import ModelConfig
from atom_aot.models.layers import RMSNorm, RotaryEmbedding, make_linear
from atom_aot.models.parallel import reduce_partial_sums
from atom_aot.ops.backends import make_backend
from atom_aot.ops.backends.base import AttentionInputs
from atom_aot.ops.backends.mla import MLAArgs, MLABackend
from atom_aot.ops.rope import yarn_softmax_scale

LORA_NORM_EPS = 1e-6      # HF builds q_a_layernorm / kv_a_layernorm with the default eps, not rms_norm_eps


def split_kv_b_proj(weight: torch.Tensor, num_heads: int, nope: int) -> tuple[torch.Tensor, torch.Tensor]:
    """kv_b_proj's weight [H * (nope + v), r] -> W_UK [H, nope, r] and W_UV [H, r, v] (the build does this)."""
    per_head = weight.unflatten(0, (num_heads, -1))          # [H, nope + v, r]
    return per_head[:, :nope].contiguous(), per_head[:, nope:].transpose(1, 2).contiguous()


class MLAAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, dtype: torch.dtype, quant: str, tp: int = 1):
        """With `tp` ranks (models/parallel.py) a rank holds 1/tp of the heads: their rows of q_b_proj (or
        q_proj), their W_UK / W_UV and their input columns of o_proj (all-reduced); the latent projection
        (kv_a) and the latent cache, which every head reads, are whole on every rank."""
        super().__init__()
        ds, hidden = cfg.deepseek, cfg.hidden_size
        self.layer, self.num_heads, self.tp = layer, cfg.num_attention_heads // tp, tp
        self.nope, self.rope, self.rank = ds.qk_nope_head_dim, ds.qk_rope_head_dim, ds.kv_lora_rank
        q_out = self.num_heads * ds.qk_head_dim
        if ds.q_lora_rank is None:
            self.q_proj = make_linear(hidden, q_out, False, dtype, quant)
        else:
            self.q_a_proj = make_linear(hidden, ds.q_lora_rank, cfg.attention_bias, dtype, quant)
            self.q_a_layernorm = RMSNorm(ds.q_lora_rank, LORA_NORM_EPS, dtype)
            self.q_b_proj = make_linear(ds.q_lora_rank, q_out, False, dtype, quant)
        self.kv_a_proj_with_mqa = make_linear(hidden, ds.latent_dim, cfg.attention_bias, dtype, quant)
        self.kv_a_layernorm = RMSNorm(ds.kv_lora_rank, LORA_NORM_EPS, dtype)
        self.w_uk = nn.Parameter(torch.empty(self.num_heads, ds.qk_nope_head_dim, ds.kv_lora_rank, dtype=dtype))
        self.w_uv = nn.Parameter(torch.empty(self.num_heads, ds.kv_lora_rank, ds.v_head_dim, dtype=dtype))
        self.o_proj = make_linear(self.num_heads * ds.v_head_dim, hidden, cfg.attention_bias, dtype, quant)
        self.scale = yarn_softmax_scale(ds.qk_head_dim ** -0.5, cfg.rope_scaling_dict)
        # an fp8 latent cache's (c_kv, k_pe) scales (ops/mla.py); ones, and unused, for any other cache
        self.register_buffer("kv_scale", torch.ones(2, dtype=torch.float32))
        # the reference backend until the model's use_kernels sets the phase's choice
        self.mla_backend: MLABackend = make_backend("mla_attention", BackendChoice("reference"))
        self.defer_reduce = False      # True: the output stays partial sums for the next norm (parallel.py)

    def query(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "q_proj"):
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))

    def forward(self, positions, x, rotary: RotaryEmbedding, attn: AttentionInputs):
        q = self.query(x).unflatten(-1, (self.num_heads, self.nope + self.rope))     # [T, H, nope + rope]
        q_nope, q_pe = q.split([self.nope, self.rope], dim=-1)
        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split([self.rank, self.rope], dim=-1)  # [T, r], [T, rope]
        kv_scale = self.kv_scale if attn.kv_cache.element_size() == 1 else None   # only an fp8 cache is scaled
        o = self.mla_backend(MLAArgs(self.layer, q_nope, q_pe, self.kv_a_layernorm(c_kv), k_pe, positions,
                                     rotary.cos_sin_cache, self.w_uk, self.w_uv, self.scale, attn,
                                     kv_scale))                                            # [T, H, v]
        return reduce_partial_sums(self.o_proj(o.flatten(-2)), self.tp, self.defer_reduce)
