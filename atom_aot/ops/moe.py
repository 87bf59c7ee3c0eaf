"""Mixture-of-experts: the routing functions and the custom op `atom::fused_moe`.

The op takes the routing already decided (a family's own routing: softmax top-k for Qwen3-MoE and
Mixtral, DeepSeek-V3's grouped sigmoid top-k, both here) and runs every token through its k experts:

    out[t] = sum_j  w[t, j] * down_e( SiLU(gate_e(x_t)) * up_e(x_t) ),   e = ids[t, j]

Being a custom op keeps it whole in `torch.export` (the compiled model calls it by name, each arch
registers its kernel for it). Expert weights are stacked per layer:

    w13: [E, 2I, H]   rows 0..I-1 = gate_proj, rows I..2I-1 = up_proj (per expert, like nn.Linear)
    w2:  [E, H, I]    down_proj

An id < 0 means "this expert is not on this rank" (expert parallelism masks remote experts so):
that slot contributes nothing.

Options of the op, each a fact of a family's model file (GPT-OSS uses all of them):
- biases `w13_bias [E, 2I]` (gate's, then up's, like w13's rows) and `w2_bias [E, H]`, float32, added to each
  projection's product in float32 (before the activation, and before the routing weight multiplies the output);
- the activation between the projections (`ExpertActivation`): SiLU(gate) * up, or GPT-OSS's clamped SwiGLU
  (gate clamped above at `limit`, up clamped to [-limit, limit], (up + 1) * gate * sigmoid(alpha * gate)).
The backends take a layer's stacks as one typed `ExpertWeights` and hand its tensors to the op, which tells the
storage formats apart by their dtypes (another format, MXFP4's blocks and scales, is more of them, not more
arguments).

FP8 experts (`--quant fp8`): w13 and w2 in e4m3 with one float32 scale per output row,
`w13_scale [E, 2I]` and `w2_scale [E, H]` (weight-only: the activations stay in the model dtype, the
rows' products are scaled after each GEMM; what pays at decode, where the experts' weight bytes bound
the step). Block-scaled fp8 checkpoints (128x128 weight blocks, Qwen3-FP8 and DeepSeek-V3 style):
`w13_scale [E, 2I/128, H/128]`, `w2_scale [E, H/128, I/128]`, W8A8 as the block-scaled linears: the
activations quantized per token and 1x128 group, each K block's products scaled by both scales. MXFP4 experts
(GPT-OSS checkpoints): w13 [E, 2I, H/2] and w2 [E, H, I/2] uint8 (two e2m1 values a byte) with uint8 e8m0 scales
per 32 values along K, w13_scale [E, 2I, H/32] and w2_scale [E, H, I/32] (ops/mxfp4.py). ops/expert_formats.py
lists the formats.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from atom_aot.ops.expert_formats import format_of
from atom_aot.ops.fp8 import fp8_linear_reference
from atom_aot.ops.mxfp4 import dequantize_mxfp4

# A fragment of the `atom` namespace that atom_aot/ops/attention.py defines; registered through the
# dispatcher directly for the same reason (custom_op's wrapper imports torch._dynamo on first call).
LIBRARY = torch.library.Library("atom", "FRAGMENT")
LIBRARY.define("fused_moe(Tensor hidden, Tensor w13, Tensor w2, Tensor topk_weights, Tensor topk_ids, "
               "Tensor? w13_scale=None, Tensor? w2_scale=None, Tensor? w13_bias=None, Tensor? w2_bias=None, "
               "str activation='silu', float alpha=1.0, float limit=0.0) -> Tensor")

ACTIVATIONS = ("silu", "swiglu_clamped")


@dataclass(frozen=True)
class ExpertActivation:
    """How an expert combines its gate and up rows (module docstring); `alpha` and `limit` are the clamped SwiGLU's
    (GPT-OSS's config: swiglu_alpha, swiglu_limit)."""
    kind: str = "silu"
    alpha: float = 1.0
    limit: float = 0.0

    def __post_init__(self):
        if self.kind not in ACTIVATIONS:
            raise ValueError(f"expert activation {self.kind!r} is not one of {', '.join(ACTIVATIONS)}")
        if self.kind == "swiglu_clamped" and not self.limit > 0:
            raise ValueError(f"the clamped SwiGLU needs a limit > 0, got {self.limit}")


SILU = ExpertActivation()


@dataclass(frozen=True)
class ExpertWeights:
    """One layer's stacked experts as the `fused_moe` op reads them (stored in one of ops/expert_formats.py's
    formats, which the op tells apart by dtype: a model hands them on without knowing which)."""
    w13: torch.Tensor                        # [E, 2I, H] (mxfp4: [E, 2I, H/2] uint8)
    w2: torch.Tensor                         # [E, H, I]  (mxfp4: [E, H, I/2] uint8)
    w13_scale: torch.Tensor | None = None    # fp8: [E, 2I] or blocks; mxfp4: [E, 2I, H/32] uint8
    w2_scale: torch.Tensor | None = None
    w13_bias: torch.Tensor | None = None     # [E, 2I] float32
    w2_bias: torch.Tensor | None = None      # [E, H] float32

    def optional(self) -> tuple[torch.Tensor | None, ...]:
        """The op's optional tensor arguments, in its order."""
        return (self.w13_scale, self.w2_scale, self.w13_bias, self.w2_bias)


def gated_activation(gate_up: torch.Tensor, activation: ExpertActivation) -> torch.Tensor:
    """gate_up [n, 2I] (gate's columns, then up's) -> [n, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    if activation.kind == "silu":
        return F.silu(gate) * up
    gate = gate.clamp(max=activation.limit)
    up = up.clamp(min=-activation.limit, max=activation.limit)
    return (up + 1) * (gate * torch.sigmoid(gate * activation.alpha))


def softmax_topk(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts in float32, the top_k of it, optionally renormalized to sum to 1.

    router_logits [T, E] -> (weights [T, k] float32, ids [T, k] int32), as Hugging Face's
    Qwen3-MoE (`norm_topk_prob`) and Mixtral (always renormalized) routers compute them.
    """
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)   # [T, E]
    weights, ids = torch.topk(probs, top_k, dim=-1)                      # [T, k]
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def top_k_softmax(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top_k of the logits, then a softmax over those k in float32 (GPT-OSS's router, as transformers computes
    it; the same weights as softmax_topk renormalized, in another order of operations).

    router_logits [T, E] -> (weights [T, k] float32, ids [T, k] int32)."""
    values, ids = torch.topk(router_logits, top_k, dim=-1)              # [T, k]
    return torch.softmax(values, dim=-1, dtype=torch.float32), ids.to(torch.int32)


@dataclass(frozen=True)
class GroupedTopK:
    """How DeepSeek-V3 routes (its config's n_group, topk_group, num_experts_per_tok, norm_topk_prob and
    routed_scaling_factor): the `topk_group` best of `n_group` expert groups, `top_k` experts inside them, weights
    renormalized if `renormalize`, times `scaling`."""
    n_group: int
    topk_group: int
    top_k: int
    renormalize: bool
    scaling: float


def grouped_sigmoid_topk(router_logits: torch.Tensor, correction_bias: torch.Tensor,
                         routing: GroupedTopK) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's router (HF's DeepseekV3TopkRouter after its linear): router_logits [T, E] float32 ->
    (weights [T, k] float32, ids [T, k] int32).

    Experts are chosen by sigmoid score + correction bias, only inside the groups whose two best biased scores sum
    highest; the weights are the unbiased scores, renormalized or not, scaled (`routing`).
    """
    scores = router_logits.sigmoid()                                               # [T, E]
    biased = scores + correction_bias
    per_group = biased.unflatten(-1, (routing.n_group, -1))                         # [T, G, E/G]
    group_scores = per_group.topk(2, dim=-1)[0].sum(dim=-1)                         # [T, G]
    group_idx = group_scores.topk(routing.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    expert_mask = group_mask.unsqueeze(-1).expand_as(per_group).flatten(1).bool()  # [T, E]
    ids = biased.masked_fill(~expert_mask, float("-inf")).topk(routing.top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, ids)
    if routing.renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routing.scaling, ids.to(torch.int32)


def fused_moe_reference(
    hidden: torch.Tensor,         # [T, H]
    w13: torch.Tensor,            # [E, 2I, H]
    w2: torch.Tensor,             # [E, H, I]
    topk_weights: torch.Tensor,   # [T, k] float32
    topk_ids: torch.Tensor,       # [T, k] int32, < 0: not on this rank
    w13_scale: torch.Tensor | None = None,   # [E, 2I] float32: w13 in e4m3, scaled per row (or blocks, mxfp4)
    w2_scale: torch.Tensor | None = None,    # [E, H] float32
    w13_bias: torch.Tensor | None = None,    # [E, 2I] float32
    w2_bias: torch.Tensor | None = None,     # [E, H] float32
    activation: str = "silu", alpha: float = 1.0, limit: float = 0.0,   # ExpertActivation's fields
) -> torch.Tensor:
    """Expert by expert in plain torch; the weighted sum accumulates in float32, then casts to hidden's dtype."""
    linear = EXPERT_LINEARS[format_of(w13, w13_scale).scale]
    act = ExpertActivation(activation, alpha, limit)
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)   # [T, H]
    for expert in range(w13.shape[0]):
        tokens, slots = torch.where(topk_ids == expert)                  # [n] each
        if tokens.numel() == 0:
            continue
        gate_up = with_bias(linear(hidden[tokens], w13[expert], _at(w13_scale, expert)), _at(w13_bias, expert))
        y = with_bias(linear(gated_activation(gate_up, act), w2[expert], _at(w2_scale, expert)),
                      _at(w2_bias, expert))                                                       # [n, H]
        out.index_add_(0, tokens, y.float() * topk_weights[tokens, slots, None])
    return out.to(hidden.dtype)


def _at(stack: torch.Tensor | None, expert: int) -> torch.Tensor | None:
    return None if stack is None else stack[expert]


def with_bias(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """y + bias, added in float32 (as the kernels add it to their float32 products), cast back to y's dtype."""
    return y if bias is None else (y.float() + bias).to(y.dtype)


# x [n, cols] times one expert's weight [rows, cols] (as stored) -> [n, rows] in x's dtype, by scale kind:
# an e4m3 weight is widened (exact in bf16) and its row scales applied to the product, in float32, as the Triton
# kernel does; with block scales the expert is W8A8 as the block-scaled linears are (ops/fp8.py): x quantized per
# token and 1x128 group, float32 sums over the dequantized values (the kernel scales each K step's fp8 product:
# the same sum); mxfp4 is dequantized to x's dtype (exact: ops/mxfp4.py) and multiplied there.
EXPERT_LINEARS = {
    "none": lambda x, w, s: F.linear(x, w),
    "row": lambda x, w, s: (F.linear(x, w.to(x.dtype)).float() * s).to(x.dtype),
    "block": lambda x, w, s: fp8_linear_reference(x, w, s, None, None),
    "mxfp4": lambda x, w, s: F.linear(x, dequantize_mxfp4(w, s, x.dtype)),
}


# CUDA too: an fp8 KV cache's scales are calibrated at build by an eager run on the reference backends
# (weights/kv_scales.py), and GPU tests compare against it; GPU arches serve the `triton` backend.
for _key in ("CPU", "CUDA"):
    LIBRARY.impl("fused_moe", fused_moe_reference, _key)


@torch.library.register_fake("atom::fused_moe", lib=LIBRARY)
def _(hidden, w13, w2, topk_weights, topk_ids, w13_scale=None, w2_scale=None, w13_bias=None, w2_bias=None,
      activation="silu", alpha=1.0, limit=0.0):
    return torch.empty_like(hidden)


fused_moe = torch.ops.atom.fused_moe
