"""Random MoE problems and a naive per-token reference, shared by the MoE op tests (reference and Triton)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from atom_aot.ops.moe import softmax_topk


def random_problem(tokens: int, experts: int, top_k: int, hidden: int = 32, inter: int = 24, *, seed: int = 0,
                   dtype=torch.float32, device="cpu", router_bias: torch.Tensor | None = None):
    """hidden [T, H], w13 [E, 2I, H], w2 [E, H, I] and a softmax top-k routing of fresh random logits.

    `router_bias` [E] is added to the logits (a large negative entry starves that expert of tokens).
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5
    w2 = torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5
    logits = torch.randn(tokens, experts, generator=g) + (0 if router_bias is None else router_bias)
    weights, ids = softmax_topk(logits, top_k, renormalize=True)
    cast = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    return cast(x), cast(w13), cast(w2), weights.to(device), ids.to(device)


def naive_moe(x, w13, w2, weights, ids, b13=None, b2=None, swiglu: tuple[float, float] | None = None,
              activations=lambda a: a) -> torch.Tensor:
    """Token by token, slot by slot, in float64: the independent check of both implementations. `b13`, `b2`: the
    experts' biases; `swiglu` (alpha, limit): GPT-OSS's clamped SwiGLU, written out from its definition;
    `activations` maps each GEMM's input row (float64) to what the GEMM multiplies (W8A8 experts: `group_quantized`)."""
    x, w13, w2, weights = x.double().cpu(), w13.double().cpu(), w2.double().cpu(), weights.double().cpu()
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t].tolist()):
            if e < 0:
                continue
            gate, up = (w13[e] @ activations(x[t]) + (0 if b13 is None else b13[e].double().cpu())).chunk(2)
            if swiglu is None:
                h = F.silu(gate) * up
            else:
                alpha, limit = swiglu
                g = torch.minimum(gate, torch.tensor(limit, dtype=torch.float64))
                h = (up.clamp(-limit, limit) + 1) * g / (1 + torch.exp(-alpha * g))
            out[t] += weights[t, j] * (w2[e] @ activations(h) + (0 if b2 is None else b2[e].double().cpu()))
    return out


def group_quantized(row: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """A float64 activation row as W8A8's 1x128 groups give it back: rounded to `dtype` (the activations' own),
    then to e4m3 with each group's amax / 448 scale (computed in float32, as ops/fp8.quantize_activations)."""
    from atom_aot.ops.fp8 import quantize_activations
    q, scale = quantize_activations(row.to(dtype)[None], None, block_scaled=True)
    return (q.double().unflatten(1, (-1, 128)) * scale.double()[..., None]).flatten(1)[0]


def expert_biases(experts: int, hidden: int, inter: int, *, seed: int, dtype=torch.float32, device="cpu"):
    """(b13 [E, 2I], b2 [E, H]) drawn fresh, large enough to move the result."""
    g = torch.Generator().manual_seed(seed)
    return (0.5 * torch.randn(experts, 2 * inter, generator=g)).to(device, dtype), \
        (0.5 * torch.randn(experts, hidden, generator=g)).to(device, dtype)


def one_layer_qwen3_moe():
    """A one-layer Qwen3-MoE model (6 experts, top-2) with random weights, for tests of how ranks split it."""
    from atom_aot.models import ModelConfig, model_class
    cfg = ModelConfig.from_hf_dict(dict(architectures=["Qwen3MoeForCausalLM"], vocab_size=64, hidden_size=32,
                                        intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=8, num_experts=6, num_experts_per_tok=2,
                                        moe_intermediate_size=24, norm_topk_prob=True, max_position_embeddings=64))
    whole = model_class(cfg.architecture)(cfg, torch.float32)
    for p in whole.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return cfg, whole


def fp8_experts(w13: torch.Tensor, w2: torch.Tensor):
    """The stacks in e4m3 with per-row scales, as `--quant fp8` stores them: (w13, w13_scale, w2, w2_scale)."""
    from atom_aot.ops.fp8 import quantize_expert_stack
    return (*quantize_expert_stack(w13), *quantize_expert_stack(w2))


def dequantized(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.double() * scale.double()[:, :, None]


def block_fp8_experts(w13: torch.Tensor, w2: torch.Tensor):
    """The stacks in e4m3 with 128x128 block scales, as block-scaled fp8 checkpoints store each expert."""
    from atom_aot.ops.fp8 import quantize_expert_stack
    return (*quantize_expert_stack(w13, blocks=True), *quantize_expert_stack(w2, blocks=True))


def block_dequantized(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    from atom_aot.ops.fp8 import dequantize_weight
    return torch.stack([dequantize_weight(q[e], scale[e]) for e in range(q.shape[0])]).double()
