"""Random MXFP4 expert stacks and an independent float64 reading of them, shared by the MXFP4 tests.

The float64 reading decodes each e2m1 code from its bits (sign, two exponent bits, one mantissa bit) and scales by
2.0 ** (e - 127) in Python floats: it shares no table or bit trick with atom_aot/ops/mxfp4.py or the kernels.
"""
from __future__ import annotations

import torch

from moe_checks import random_problem


def e2m1_float64(code: int) -> float:
    sign, exponent, mantissa = code >> 3, (code >> 1) & 3, code & 1
    magnitude = mantissa * 0.5 if exponent == 0 else (1 + mantissa * 0.5) * 2.0 ** (exponent - 1)
    return -magnitude if sign else magnitude


def mxfp4_float64(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """blocks [..., N, K/2] uint8, scales [..., N, K/32] uint8 -> float64 [..., N, K]: byte j holds k = 2j in its low
    nibble, 2j + 1 in its high one; e = 255 is NaN."""
    table = torch.tensor([e2m1_float64(c) for c in range(16)], dtype=torch.float64)
    low, high = table[(blocks & 0xF).long()], table[(blocks >> 4).long()]
    values = torch.stack([low, high], dim=-1).flatten(-2)                                   # [..., N, K]
    scale = torch.tensor([2.0 ** (e - 127) for e in range(256)], dtype=torch.float64)[scales.long()]
    scale = torch.where(scales == 255, float("nan"), scale)
    return values * scale.repeat_interleave(32, dim=-1)


def random_mxfp4(experts: int, rows: int, cols: int, exponents: tuple[int, int], generator: torch.Generator):
    """(blocks [E, rows, cols/2], scales [E, rows, cols/32]): every byte value drawn, exponents in [lo, hi)."""
    blocks = torch.randint(0, 256, (experts, rows, cols // 2), dtype=torch.uint8, generator=generator)
    scales = torch.randint(*exponents, (experts, rows, cols // 32), dtype=torch.uint8, generator=generator)
    return blocks, scales


def mxfp4_problem(tokens: int, experts: int, top_k: int, hidden: int = 64, inter: int = 64, *, seed: int = 0,
                  exponents=(118, 126), biases: bool = False, router_bias: torch.Tensor | None = None):
    """(x [T, H], ExpertWeights-like dict of mxfp4 stacks (and float32 biases), weights, ids): fresh random bytes.
    Exponents 118..125 give weights of 2^-9 .. 6 * 2^-2, so the products stay well inside float32 and bf16."""
    g = torch.Generator().manual_seed(seed)
    x, _, _, weights, ids = random_problem(tokens, experts, top_k, hidden, inter, seed=seed, router_bias=router_bias)
    w13, s13 = random_mxfp4(experts, 2 * inter, hidden, exponents, g)
    w2, s2 = random_mxfp4(experts, hidden, inter, exponents, g)
    stacks = dict(w13=w13, w2=w2, w13_scale=s13, w2_scale=s2)
    if biases:
        stacks |= dict(w13_bias=torch.randn(experts, 2 * inter, generator=g), w2_bias=torch.randn(experts, hidden,
                                                                                                   generator=g))
    return x, stacks, weights, ids


def naive_moe_biased(x, w13, w2, weights, ids, b13=None, b2=None) -> torch.Tensor:
    """Token by token in float64 over float64 weights, with optional biases: out[t] += w * (w2 (SiLU(g) * u) + b2),
    [g; u] = w13 x + b13."""
    import torch.nn.functional as F
    x, weights = x.double(), weights.double()
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j, e in enumerate(ids[t].tolist()):
            if e < 0:
                continue
            h = w13[e] @ x[t] + (0 if b13 is None else b13[e].double())
            gate, up = h.chunk(2)
            out[t] += weights[t, j] * (w2[e] @ (F.silu(gate) * up) + (0 if b2 is None else b2[e].double()))
    return out


def write_mxfp4_moe(src, mxfp4_dir, reference_dir, seed: int = 0, exponents=(120, 124), router: str = "gate"):
    """From `src` (a tiny HF MoE folder whose transformers model stacks its experts: Qwen3-MoE / Mixtral [E, N, K],
    GPT-OSS [E, K, N]): `mxfp4_dir`, the same model with every layer's experts replaced by fresh random mxfp4 bytes,
    stored as GPT-OSS stores them (`mlp.experts.gate_up_proj_blocks [E, 2I, H/32, 16]`, `_scales [E, 2I, H/32]`,
    down_proj's likewise; the experts' biases, where there are any, as they are; quantization_config mxfp4), and
    `reference_dir`, an unquantized checkpoint whose experts are transformers' dequantization of those bytes
    (integrations/mxfp4.py convert_moe_packed_tensors). `router`: the router module's name. Returns both folders."""
    import json
    import shutil
    from pathlib import Path

    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    g = torch.Generator().manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    packed = {}
    for i, layer in enumerate(model.model.layers):
        experts = getattr(layer.mlp, "experts", None)
        for proj in ("gate_up_proj", "down_proj") if experts is not None else ():
            param = getattr(experts, proj)                                  # [E, N, K], GPT-OSS's [E, K, N]
            outputs_last = type(experts).__name__ == "GptOssExperts"
            n, k = (param.shape[2], param.shape[1]) if outputs_last else (param.shape[1], param.shape[2])
            blocks, scales = random_mxfp4(param.shape[0], n, k, exponents, g)
            blocks = blocks.unflatten(-1, (-1, 16))                                     # [E, N, K/32, 16]
            dequantized = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)    # [E, K, N]
            with torch.no_grad():
                param.copy_(dequantized if outputs_last else dequantized.transpose(1, 2))
            packed |= {f"model.layers.{i}.mlp.experts.{proj}_blocks": blocks,
                       f"model.layers.{i}.mlp.experts.{proj}_scales": scales}
    shutil.copytree(src, reference_dir)
    model.save_pretrained(str(reference_dir), safe_serialization=True)
    shutil.copytree(src, mxfp4_dir)
    for f in Path(mxfp4_dir).glob("*.safetensors"):
        f.unlink()
    tensors = {name: t for f in Path(reference_dir).glob("*.safetensors") for name, t in load_file(str(f)).items()
               if ".mlp.experts." not in name or name.endswith("_bias")}
    save_file({**tensors, **packed}, str(Path(mxfp4_dir) / "model.safetensors"))
    config = json.loads((Path(mxfp4_dir) / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", f"model.layers.*.mlp.{router}", "model.embed_tokens", "lm_head"]}
    (Path(mxfp4_dir) / "config.json").write_text(json.dumps(config))
    return mxfp4_dir, reference_dir


MOE_CONFIG = dict(architectures=["Qwen3MoeForCausalLM"], vocab_size=64, hidden_size=64, intermediate_size=96,
                  num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
                  num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True, max_position_embeddings=64)


def every_code_at_every_exponent():
    """blocks [256, 16], each row the 32 codes 0..15, 15..0 (two a byte, low nibble first); scales [256, 1]: 0..255."""
    codes = torch.arange(16, dtype=torch.uint8)
    pairs = torch.cat([codes, codes.flip(0)])                          # 32 codes
    blocks = (pairs[0::2] | (pairs[1::2] << 4)).repeat(256, 1)        # [256, 16]
    return blocks, torch.arange(256, dtype=torch.uint8)[:, None]


def random_experts(seed: int = 0):
    """One-rank mxfp4 experts with biases (E 4, H 64, I 64), bytes, exponents 118..125 and biases drawn from `seed`."""
    from atom_aot.models.moe import MoEExperts
    experts = MoEExperts(4, 64, 64, torch.float32, quant="mxfp4", bias=True)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in experts.named_parameters():
            p.copy_(torch.randint(0, 256, p.shape, generator=g) if p.dtype == torch.uint8 and "scale" not in name
                    else torch.randint(118, 126, p.shape, generator=g) if p.dtype == torch.uint8
                    else torch.randn(p.shape, generator=g))
    return experts
