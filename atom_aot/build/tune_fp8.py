"""The FP8 and INT4 linears' backend per phase, measured on the model's own GEMM shapes at build time.

fp8 candidates are cuBLASLt (`aten`: torch._scaled_mm, per-channel layouts only) and each Triton GEMM
config of atom_aot/ops/triton/fp8_gemm.py; int4 (W4A16) candidates are `aten` (dequantize, then
cuBLAS) and each config of atom_aot/ops/triton/int4_gemm.py. Every candidate is timed on every
linear of the model (qkv, o, gate_up, down) at the phase's token counts, and tune.py keeps the one
with the lowest geometric-mean slowdown against each shape's fastest.

With `fp8` (per-token) weights, the quantized inputs are measured too: the down projection's (silu(gate) * up)
and the qkv and gate_up projections' (residual add + RMSNorm): Inductor's kernels for the torch code against
the one-pass Triton kernels (ops/triton/silu_mul_quant.py, rms_norm_quant.py) at each warp count, on the
model's MLP width and hidden size, and each phase's row names the faster (`silu_mul_quant`, `rms_norm_quant`).

For decode with fp8, int8 or int4 weights the small-M kernel's configs (ops/triton/small_m_gemm.py,
int4_small_m.py; block_k dividing 128 for block-scaled fp8 and grouped int4 weights: small_m_configs) are
timed too, at M <= SMALL_M_MAX: where the best of them beats the best of the others there, every phase
gets the `small_m+aten` / `small_m+triton` backend (that kernel up to SMALL_M_MAX tokens, the phase's best
GEMM above it: the mixed phase runs speculative verify steps and short prefills of a few tokens too), else
the one GEMM as before (`small_m_pick`, `phase_choice`).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from atom_aot.artifact.tuning import BackendChoice
from atom_aot.models import ModelConfig
from atom_aot.models.quant_layers import INT4_SCHEMES, INT8_SCHEMES, int4_groups, linear_op
from atom_aot.ops.int4 import GROUP as INT4_GROUP

TOKENS = {"decode": (1, 16, 64, 256), "mixed": (512, 2048, 8192)}
SMALL_M_MAX = 16                 # the small-M kernel's BLOCK_M: one M tile, each weight byte read once
SMALL_M_SCHEMES = ("fp8", "fp8-static", "fp8-ub", "fp8-block", *INT8_SCHEMES, *INT4_SCHEMES)
Candidate = tuple   # ("aten",) or ("triton", block_m, block_n, block_k, num_warps, num_stages)
TRITON_KERNELS = {"fp8_linear": "fp8_gemm", "int4_linear": "int4_gemm"}    # op -> its Triton kernel's params key
SMALL_M_KERNELS = {"fp8_linear": "fp8_small_m", "int8_linear": "int8_small_m",   # op -> the small-M params key
                   "int4_linear": "int4_small_m"}


def linear_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """Layer group -> (N, K) of its weight (a latent-attention model's own projections where it has them)."""
    if cfg.deepseek is not None:
        ds, heads = cfg.deepseek, cfg.num_attention_heads
        q_in = ds.q_lora_rank or cfg.hidden_size
        return {"q_b_proj": (heads * ds.qk_head_dim, q_in), "kv_a_proj_with_mqa": (ds.latent_dim, cfg.hidden_size),
                "o_proj": (cfg.hidden_size, heads * ds.v_head_dim),
                "gate_up_proj": (2 * cfg.intermediate_size, cfg.hidden_size),
                "down_proj": (cfg.hidden_size, cfg.intermediate_size)}
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    return {"qkv_proj": (q + 2 * kv, cfg.hidden_size), "o_proj": (cfg.hidden_size, q),
            "gate_up_proj": (2 * cfg.intermediate_size, cfg.hidden_size),
            "down_proj": (cfg.hidden_size, cfg.intermediate_size)}


def candidates(scheme: str) -> list[Candidate]:
    if scheme in INT8_SCHEMES:
        return [("aten",)]             # cuBLAS's _int_mm; the small-M kernel is timed apart (measure_small_m)
    if scheme in INT4_SCHEMES:
        from atom_aot.ops.triton.int4_gemm import CANDIDATE_CONFIGS
    else:
        from atom_aot.ops.triton.fp8_gemm import CANDIDATE_CONFIGS
    triton = [("triton", *c.as_args()) for c in CANDIDATE_CONFIGS]
    return triton if scheme == "fp8-block" else [("aten",)] + triton


def as_choice(candidate: Candidate, op: str = "fp8_linear") -> BackendChoice:
    if candidate[0] == "aten":
        return BackendChoice("aten")
    return BackendChoice("triton", {TRITON_KERNELS[op]: candidate[1:]})


def measure_linear(cfg: ModelConfig, scheme: str, dtype: torch.dtype, phase: str) -> dict[str, dict]:
    """'{group} {M}x{N}x{K}' -> {candidate: ms} for the phase's token counts."""
    import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::*)
    from atom_aot.ops.backends import make_backend
    from atom_aot.ops.triton.timing import measure_ms
    op, rows = linear_op(scheme), {}
    for group, (n, k) in linear_shapes(cfg).items():
        layer = _random_layer(scheme, n, k)
        for m in TOKENS[phase]:
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            row = rows.setdefault(f"{group} {m}x{n}x{k}", {})
            for candidate in candidates(scheme):
                gemm = make_backend(op, as_choice(candidate, op))
                row[candidate] = measure_ms(lambda: gemm(x, *layer, None))[0]
    return rows


def measure_small_m(cfg: ModelConfig, scheme: str, dtype: torch.dtype, timer) -> dict[str, dict]:
    """'{group} {M}x{N}x{K}' -> {("small_m", *config): ms, or None where `timer` (fn, config) says the
    config does not fit this GPU} at the decode token counts <= SMALL_M_MAX."""
    import atom_aot.ops.triton  # noqa: F401
    from atom_aot.ops.backends import make_backend
    configs = small_m_configs(scheme)
    large = candidates(scheme)[-1]            # never runs at these M; block-scaled weights need a triton one
    op, rows = linear_op(scheme), {}
    for group, (n, k) in linear_shapes(cfg).items():
        layer = _random_layer(scheme, n, k)
        for m in (m for m in TOKENS["decode"] if m <= SMALL_M_MAX):
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            row = rows.setdefault(f"{group} {m}x{n}x{k}", {})
            for config in configs:
                gemm = make_backend(op, small_m_choice(config, large, op))   # eager: M <= max: small
                row[("small_m", *config)] = timer(lambda: gemm(x, *layer, None), ("small_m", *config))
    return rows


def measure_silu_mul_quant(cfg: ModelConfig, dtype: torch.dtype, phases: tuple[str, ...], timer) -> dict[str, dict]:
    """phase ("decode" / "mixed") -> 'silu_mul_quant {M}x{N}' -> {candidate: ms}: ("inductor",) is what Inductor
    compiles of the torch code (once, with a dynamic token count, as the exported packages have it), ("triton",
    warps) the one-pass kernel, None where `timer` (fn, candidate) says it does not fit this GPU (a row in
    registers: a smaller register file)."""
    import atom_aot.ops.triton  # noqa: F401
    from atom_aot.ops.backends.silu_mul_quant import InductorSiluMulQuant
    from atom_aot.ops.triton.silu_mul_quant import CANDIDATE_WARPS, launch_silu_mul_quant
    n = cfg.intermediate_size
    return _measure_row_quantizer(
        "silu_mul_quant", n, phases, lambda m: (torch.randn(m, 2 * n, device="cuda", dtype=dtype),),
        InductorSiluMulQuant(BackendChoice("inductor")), launch_silu_mul_quant, CANDIDATE_WARPS, timer)


def measure_rms_norm_quant(cfg: ModelConfig, dtype: torch.dtype, phases: tuple[str, ...], timer) -> dict[str, dict]:
    """phase -> 'rms_norm_quant {M}x{H}' -> {candidate: ms}, as measure_silu_mul_quant: the residual add, RMSNorm
    and per-token quantization before an fp8 qkv or gate_up projection, on the model's hidden size."""
    import atom_aot.ops.triton  # noqa: F401
    from atom_aot.ops.backends.rms_norm_quant import InductorRmsNormQuant
    from atom_aot.ops.triton.rms_norm_quant import CANDIDATE_WARPS, launch_add_rms_norm_quant
    h, eps = cfg.hidden_size, cfg.rms_norm_eps
    weight = torch.randn(h, device="cuda", dtype=dtype)

    def inputs(m: int) -> tuple:
        return (torch.randn(m, h, device="cuda", dtype=dtype), torch.randn(m, h, device="cuda", dtype=dtype),
                weight, eps)
    return _measure_row_quantizer("rms_norm_quant", h, phases, inputs, InductorRmsNormQuant(BackendChoice("inductor")),
                                  launch_add_rms_norm_quant, CANDIDATE_WARPS, timer)


def _measure_row_quantizer(name: str, width: int, phases: tuple[str, ...], inputs, inductor, launch, warps_list,
                           timer) -> dict[str, dict]:
    """phase -> '{name} {M}x{width}' -> {("inductor",): ms, ("triton", warps): ms or None} at the phase's token
    counts; `inputs(M)` -> the arguments both take (the kernel's launcher also its warp count)."""
    from atom_aot.ops.triton.timing import measure_ms
    compiled = torch.compile(inductor, dynamic=True, fullgraph=True)
    measured = {}
    for phase in phases:
        rows = measured[phase] = {}
        for m in TOKENS[phase]:
            args = inputs(m)
            row = rows[f"{name} {m}x{width}"] = {("inductor",): measure_ms(lambda: compiled(*args))[0]}
            for warps in warps_list:
                row[("triton", warps)] = timer(lambda: launch(*args, warps), ("triton", warps))
    return measured


def row_quantizer_choice(op: str, candidate: Candidate) -> BackendChoice:
    """The `op` (silu_mul_quant, rms_norm_quant) backend of a measured candidate."""
    if candidate[0] == "inductor":
        return BackendChoice("inductor")
    return BackendChoice("triton", {op: candidate[1:]})


def small_m_configs(scheme: str) -> list[tuple[int, ...]]:
    """The small-M kernel's candidate (block_n, block_k, split_k, warps, stages) for `scheme`: a K step must lie
    in one scale group where the weight has groups (fp8 128x128 blocks, int4 groups of 128)."""
    from atom_aot.ops.fp8 import BLOCK
    if scheme in INT4_SCHEMES:
        from atom_aot.ops.triton.int4_small_m import CANDIDATE_CONFIGS
        group = None if scheme == "int4-w4a16-channel" else INT4_GROUP
    else:
        from atom_aot.ops.triton.small_m_gemm import CANDIDATE_CONFIGS
        group = BLOCK if scheme == "fp8-block" else None
    return [c for c in CANDIDATE_CONFIGS if group is None or group % c[1] == 0]


def small_m_choice(small: tuple[int, ...], large: Candidate, op: str = "fp8_linear") -> BackendChoice:
    """The small-M kernel with `small` (block_n, block_k, split_k, warps, stages) up to SMALL_M_MAX
    tokens, the `large` candidate above."""
    params = {SMALL_M_KERNELS[op]: (SMALL_M_MAX, *small)}
    if large[0] == "triton":
        params[TRITON_KERNELS[op]] = large[1:]
    return BackendChoice(f"small_m+{large[0]}", params)


def _m_of(shape: str) -> int:
    return int(shape.rsplit(" ", 1)[1].split("x")[0])


def small_m_pick(rows: dict[str, dict], small_rows: dict[str, dict], best) -> Optional[Candidate]:
    """The small-M config (from `small_rows`, by `best`: tune.py's geometric-mean pick), or None where it
    is not faster than the best other candidate over the decode shapes at M <= SMALL_M_MAX."""
    small = best(small_rows)
    upto = [shape for shape in rows if _m_of(shape) <= SMALL_M_MAX]
    gain = sum(math.log(min(v for v in rows[shape].values() if v is not None) / small_rows[shape][small])
               for shape in upto)
    return small if gain > 0 else None


def phase_choice(rows: dict[str, dict], best, small: Optional[Candidate], op: str) -> tuple[BackendChoice, str]:
    """A phase's backend and its label: the best GEMM over `rows` as before; with `small`, that kernel up
    to SMALL_M_MAX tokens and the best GEMM over the rows above it (a verify step or a short prefill in
    the mixed phase has a few tokens as decode does)."""
    above = {shape: row for shape, row in rows.items() if _m_of(shape) > SMALL_M_MAX}
    if small is None or not above:
        overall = best(rows)
        return as_choice(overall, op), ",".join(map(str, overall))
    large = best(above)
    choice = small_m_choice(small[1:], large, op)
    return choice, f"{choice.backend}: small_m {','.join(map(str, small[1:]))} up to M {SMALL_M_MAX}, " \
                   f"{','.join(map(str, large))} above"


def _random_layer(scheme: str, n: int, k: int):
    if scheme in INT4_SCHEMES:
        return _random_int4_layer(scheme, n, k)
    return _random_int8_layer(scheme, n, k) if scheme in INT8_SCHEMES else _random_fp8_layer(scheme, n, k)


def _random_int8_layer(scheme: str, n: int, k: int):
    from atom_aot.ops.int8 import INT8_MAX, quantize_weight_int8
    weight, scale = quantize_weight_int8(torch.randn(n, k, device="cuda") / k ** 0.5)
    input_scale = torch.full((1,), 4.0 / INT8_MAX, device="cuda") if scheme == "int8-static" else None
    return weight, scale, input_scale


def _random_fp8_layer(scheme: str, n: int, k: int):
    from atom_aot.ops.fp8 import FP8_MAX, quantize_weight_blocks, quantize_weight_per_channel
    w = torch.randn(n, k, device="cuda") / k ** 0.5
    weight, scale = (quantize_weight_blocks if scheme == "fp8-block" else quantize_weight_per_channel)(w)
    input_scale = torch.full((1,), 4.0 / FP8_MAX, device="cuda") if scheme == "fp8-static" else None
    return weight, scale, input_scale


def _random_int4_layer(scheme: str, n: int, k: int):
    groups = int4_groups(scheme, k)
    weight = torch.randint(0, 256, (n, k // 2), device="cuda", dtype=torch.uint8)
    scale = torch.rand(n, groups, device="cuda") / (8 * k ** 0.5)
    zero = torch.randint(0, 16, (n, groups), device="cuda", dtype=torch.uint8)
    return weight, scale, zero
