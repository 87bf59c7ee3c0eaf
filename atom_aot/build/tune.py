"""Kernel choices for the target, measured at build time and stored in tuning.json.

The runtime reads these and never autotunes. Each phase's row names, per op, a backend of the
registry (atom_aot/ops/backends) and its launch params. On the CPU there is one implementation of
each op (the `reference` attention backend; Inductor's C++ code for the rest), so nothing is
measured. On a GPU arch each Triton kernel's candidate configs are timed on the model's own shapes
(decode at batches 1 to 256, prefill at two token counts) and the one closest to each shape's
fastest is kept per phase: `decode` for the decode package the CUDA graphs replay, `mixed` for
everything else. A decode config's key-split count adapts to the batch at run time
(atom_aot/ops/triton/paged_attention.split_count), so one config can be near-best from batch 1 to 256.
A model with experts also gets the fused MoE op's fastest config per token-count bucket, timed on its
own expert shapes (both phases carry the whole table: the op picks the bucket from T as it runs).
"""
from __future__ import annotations

import functools
import logging

import torch

from atom_aot.artifact.manifest import linear_scheme as linear_scheme_of
from atom_aot.artifact.phase import Phase
from atom_aot.artifact.tuning import BackendChoice, PhaseTuning, Tuning, timings_json
from atom_aot.build.config import BuildConfig
from atom_aot.build.measure import best_config, ms_unless_too_big
from atom_aot.dtypes import torch_dtype
from atom_aot.models import ModelConfig, model_class
from atom_aot.models.quant_layers import linear_op
from atom_aot.ops.fp8 import fits_one_program

log = logging.getLogger("atom_aot")

DECODE_BATCHES = (1, 8, 32, 128, 256)
# (sequences, tokens each); 8 x 1024 is a full prefill step at the scheduler's 8192 batched tokens, where the
# grid is 8x 1x1024's (the small shapes alone are latency-bound: their configs' spread is what launches cost)
PREFILL_BATCHES = ((1, 1024), (4, 512), (8, 1024))
PREFILL_MOE_TOKENS = 2048                    # where the MoE op's last (prefill) bucket is timed
CPU_LINEAR_KERNELS = {"fp8_linear": ("fp8 gemm", "float32 reference on fp8 values (atom::fp8_linear)"),
                      "int8_linear": ("int8 gemm", "exact integer accumulation reference (atom::int8_linear)"),
                      "int4_linear": ("int4 gemm", "exact dequantization (q - z) * s to float32, then a float32 "
                                                   "matmul (atom::int4_linear)")}
GPU_LINEAR_KERNELS = {"fp8_linear": ("fp8 gemm", "aten (cuBLASLt _scaled_mm) or triton atom_triton::fp8_linear, "
                                                  "decode's small M on atom_triton::scaled_mm_small_m where faster"),
                      "int4_linear": ("int4 gemm", "triton atom_triton::int4_linear (nibbles unpacked in "
                                                   "registers) or aten (dequantize, then cuBLAS), decode's small M "
                                                   "on atom_triton::int4_linear_small_m where faster"),
                      "int8_linear": ("int8 gemm", "aten torch._int_mm (cuBLAS int8 GEMM, int32 accumulation; rows "
                                                   "padded by 16), decode's small M on "
                                                   "atom_triton::scaled_mm_small_m where faster")}


def tune_kernels(config: BuildConfig, model_config: ModelConfig, max_model_len: int,
                 weights_scheme: str = "none") -> Tuning:
    """`weights_scheme`: the artifact's (artifact/manifest.py WEIGHT_SCHEMES); one whose decoder linears are quantized
    adds an fp8_linear, int8_linear or int4_linear choice, and the MoE op is timed on experts stored as it stores
    them."""
    ops = model_class(model_config.architecture).ATTENTION_OPS
    experts_scheme, linear_scheme = weights_scheme, linear_scheme_of(weights_scheme)
    if config.arch != "cpu" and "mla_attention" in ops:
        from atom_aot.build.tune_mla import tune_mla
        tune_moe = functools.partial(_tune_moe, weights_scheme=experts_scheme)
        tuning = tune_mla(config, model_config, max_model_len, tune_moe, moe_kernel_label(experts_scheme))
        return tuning if linear_scheme == "none" else _with_measured_linear(tuning, config, model_config, linear_scheme)
    if config.arch == "cpu":
        names = {"attention": "torch reference (atom::paged_attention)",
                 "mla_attention": "torch reference (atom::mla_attention)", "moe": "torch reference (atom::fused_moe)"}
        chosen = list(ops) + (["moe"] if model_config.num_experts else [])
        choices = {op: BackendChoice("reference") for op in chosen}
        kernels = {**{op: names[op] for op in chosen}, "gemm": "aten (Inductor extern call)"}
        if linear_scheme != "none":
            op = linear_op(linear_scheme)
            choices[op] = BackendChoice("aten")
            label, text = CPU_LINEAR_KERNELS[op]
            kernels[label] = f"{linear_scheme}: {text}"
        return Tuning(arch="cpu", measured=False, phases={Phase.MIXED: PhaseTuning(choices)},
                      kernels={**kernels, "norms/activations": "Inductor C++ (fused)", "sampling": "torch"})
    tuning = _tune_triton(config, model_config, max_model_len, experts_scheme)
    return tuning if linear_scheme == "none" else _with_measured_linear(tuning, config, model_config, linear_scheme)


def _with_measured_linear(tuning: Tuning, config: BuildConfig, cfg: ModelConfig, scheme: str) -> Tuning:
    """`tuning` plus each phase's measured fp8_linear or int4_linear backend."""
    from atom_aot.build.tune_fp8 import SMALL_M_SCHEMES, measure_linear, measure_small_m, phase_choice, small_m_pick
    op, phases, timings = linear_op(scheme), {}, {}
    rows = {phase: measure_linear(cfg, scheme, config.torch_dtype, "decode" if phase == Phase.DECODE else "mixed")
            for phase in tuning.phases}
    small = None
    if Phase.DECODE in rows and scheme in SMALL_M_SCHEMES:
        small_rows = measure_small_m(cfg, scheme, config.torch_dtype, ms_unless_too_big)
        small = small_m_pick(rows[Phase.DECODE], small_rows, best_config)
        rows[Phase.DECODE] = {shape: {**r, **small_rows.get(shape, {})} for shape, r in rows[Phase.DECODE].items()}
    for phase, row in tuning.phases.items():
        choice, chosen = phase_choice(rows[phase], best_config, small, op)
        phases[phase] = PhaseTuning({**row.ops, op: choice})
        timings[phase.value] = {"chosen": chosen, **timings_json(rows[phase])}
    label, text = GPU_LINEAR_KERNELS[op]
    kernels = {**tuning.kernels, label: f"{scheme}: {text}, per phase as measured"}
    measurements = {**tuning.measurements_ms, op: timings}
    if scheme == "fp8":
        from atom_aot.build.tune_fp8 import measure_rms_norm_quant, measure_silu_mul_quant
        for op, label, width, measure, where in (
                ("silu_mul_quant", "silu-mul + fp8 quant", cfg.intermediate_size, measure_silu_mul_quant,
                 "before down_proj"),
                ("rms_norm_quant", "rms-norm + fp8 quant", cfg.hidden_size, measure_rms_norm_quant,
                 "before qkv_proj and gate_up_proj")):
            if fits_one_program(width):
                phases, kernels[label], measurements[op] = _with_row_quantizer(phases, config, cfg, op, measure, where)
    return Tuning(arch=tuning.arch, measured=True, phases=phases, kernels=kernels, measurements_ms=measurements)


KERNEL_OPS = {"silu_mul_quant": "silu_mul_quant", "rms_norm_quant": "add_rms_norm_quant"}   # row op -> atom_triton op


def _with_row_quantizer(phases: dict, config: BuildConfig, cfg: ModelConfig, op: str, measure,
                        where: str) -> tuple[dict, str, dict]:
    """Each phase's row plus its measured `op` backend (silu_mul_quant, rms_norm_quant: tune_fp8.py), the kernels
    line for inspect, the timings (each token-count set measured once: the mixed one serves every phase but
    decode)."""
    from atom_aot.build.tune_fp8 import row_quantizer_choice
    kinds = {phase: "decode" if phase == Phase.DECODE else "mixed" for phase in phases}
    measured = measure(cfg, config.torch_dtype, tuple(sorted(set(kinds.values()))), ms_unless_too_big)
    best = {kind: best_config(rows) for kind, rows in measured.items()}
    out = {phase: PhaseTuning({**row.ops, op: row_quantizer_choice(op, best[kinds[phase]])})
           for phase, row in phases.items()}
    timings = {phase.value: {"chosen": ",".join(map(str, best[kinds[phase]])), **timings_json(measured[kinds[phase]])}
               for phase in phases}
    picks = [f"{phase.value}: " + ("Inductor's kernels" if best[kind][0] == "inductor" else
                                   f"triton atom_triton::{KERNEL_OPS[op]} ({best[kind][1]} warps)")
             for phase, kind in kinds.items()]
    log.info("%s quantization %s: %s", op.replace("_quant", ""), where, "; ".join(picks))
    return out, "; ".join(picks) + " (as measured)", timings


def _tune_triton(config: BuildConfig, cfg: ModelConfig, max_model_len: int, weights_scheme: str = "none") -> Tuning:
    import atom_aot.ops.triton  # noqa: F401  (registers the ops)
    from atom_aot.ops.triton.paged_attention import CANDIDATE_CONFIGS as ATTENTION, AttentionConfig, split_count
    from atom_aot.ops.triton.rope_cache import CANDIDATE_CONFIGS as ROPE
    context = min(max_model_len - 1, 2048)
    measurements = {"decode": {}, "prefill": {}, "rope_cache": {}}
    for batch in DECODE_BATCHES:
        measurements["decode"][batch] = _time_attention(cfg, config, ATTENTION["decode"], [context] * batch, [1] * batch)
    for seqs, tokens in PREFILL_BATCHES:
        measurements["prefill"][f"{seqs}x{tokens}"] = _time_attention(cfg, config, ATTENTION["prefill"],
                                                                      [0] * seqs, [tokens] * seqs)
    for tokens in (8, 1024):
        measurements["rope_cache"][tokens] = _time_rope(cfg, config, ROPE, tokens)
    moe_ops, moe_kernels = {}, {}
    if cfg.num_experts:
        moe_ops["moe"], measurements["moe"] = _tune_moe(cfg, config, weights_scheme=weights_scheme)
        moe_kernels["moe"] = moe_kernel_label(weights_scheme)
    rope, decode = best_config(measurements["rope_cache"]), best_config(measurements["decode"])
    chosen = AttentionConfig(*decode)
    decode_splits = {str(batch): split_count(batch, cfg.num_key_value_heads, chosen.target_programs, chosen.max_splits)
                     for batch in DECODE_BATCHES}

    def attention_row(attention_config: tuple[int, ...]) -> PhaseTuning:
        params = {"paged_attention": attention_config, "qk_norm_rope_cache_write": rope}
        return PhaseTuning({"attention": BackendChoice("triton", params), **moe_ops})

    return Tuning(
        arch=config.arch, measured=True,
        phases={Phase.DECODE: attention_row(decode),
                Phase.MIXED: attention_row(best_config(measurements["prefill"]))},
        kernels={"attention": "triton atom_triton::paged_attention (decode / mixed configs above)",
                 "qk_norm+rope+kv write": "triton atom_triton::qk_norm_rope_cache_write", **moe_kernels,
                 "gemm": "aten -> cuBLAS (Inductor extern call)",
                 "norms/activations": "Inductor-generated Triton (fused, compiled into the package)",
                 "sampling": "torch on the GPU"},
        measurements_ms={"context_tokens": context, "decode_key_splits_by_batch": decode_splits,
                         **{kind: timings_json(rows) for kind, rows in measurements.items()}})


def _batch(cfg: ModelConfig, config: BuildConfig, context: list[int], new: list[int]):
    from atom_aot.ops.triton.batch_inputs import make_paged_batch
    return make_paged_batch(context, new, cfg.num_key_value_heads, cfg.head_dim, block_size=config.block_size,
                            num_layers=1, dtype=torch_dtype(config.kv_cache_element_dtype), device="cuda")


def _time_attention(cfg, config: BuildConfig, candidates, context: list[int], new: list[int]) -> dict:
    b = _batch(cfg, config, context, new)
    q = torch.randn(sum(new), cfg.num_attention_heads, cfg.head_dim, device="cuda", dtype=config.torch_dtype)
    op, scale = torch.ops.atom_triton.paged_attention, cfg.head_dim ** -0.5
    times = {}
    for c in candidates:
        args = c.as_args()
        times[args] = ms_unless_too_big(lambda: op(q, b.kv_cache, 0, b.block_tables, b.seq_lens, b.query_start_loc,
                                                    scale, *args), c)
    return times


def _time_rope(cfg, config: BuildConfig, candidates, tokens: int) -> dict:
    from atom_aot.ops.rope import rope_cos_sin_cache
    from atom_aot.ops.triton.timing import measure_ms
    b = _batch(cfg, config, [0] * tokens, [1] * tokens)
    dt, dev = config.torch_dtype, "cuda"
    q = torch.randn(tokens, cfg.num_attention_heads, cfg.head_dim, device=dev, dtype=dt)
    k = torch.randn(tokens, cfg.num_key_value_heads, cfg.head_dim, device=dev, dtype=dt)
    v = torch.randn_like(k)
    positions = torch.randint(0, 4096, (tokens,), device=dev)
    rotary_dim = model_class(cfg.architecture).rotary_dim(cfg)      # partial rotary: fewer than head_dim
    cos_sin = rope_cos_sin_cache(rotary_dim, cfg.rope_theta, cfg.rope_scaling_dict, 4096).to(dev)
    w = torch.randn(cfg.head_dim, device=dev, dtype=dt)
    op = torch.ops.atom_triton.qk_norm_rope_cache_write
    times = {}
    for c in candidates:
        args = c.as_args()
        times[args] = measure_ms(lambda: op(q, k, v, positions, cos_sin, w, w, 1e-6, b.kv_cache, 0,
                                            b.slot_mapping, *args))[0]
    return times


def moe_kernel_label(weights_scheme: str) -> str:
    from atom_aot.models.moe import expert_format
    stored = {"row": "; e4m3 experts, row scales, bf16 activations",
              "block": "; e4m3 experts, block scales, bf16 activations",
              "mxfp4": "; mxfp4 experts (e2m1 + e8m0 per 32, widened to bf16 in registers), bf16 activations",
              }.get(expert_format(weights_scheme).scale, "")
    return f"triton atom_triton::fused_moe (sort by expert, grouped GEMMs; config per token bucket{stored})"


def _tune_moe(cfg: ModelConfig, config: BuildConfig, dev: str = "cuda",
              weights_scheme: str = "none") -> tuple[BackendChoice, dict]:
    """Per token-count bucket, the fastest candidate on one layer of the model's experts (random weights stored as
    the model stores them: ops/expert_formats.py; softmax top-k routing of random logits); timed at each bucket's
    first token count, the last at PREFILL_MOE_TOKENS. Returns the `triton` choice and the timings."""
    from atom_aot.models.moe import expert_format
    from atom_aot.ops.moe import softmax_topk
    from atom_aot.ops.triton.fused_moe import TOKEN_BUCKETS
    dt, experts, hidden = config.torch_dtype, cfg.num_experts, cfg.hidden_size
    stored = expert_format(weights_scheme)
    stacks = random_expert_stacks(stored, experts, cfg.moe_intermediate_size, hidden, dt, dev)
    op, params, times = torch.ops.atom_triton.fused_moe, {}, {}
    for first in TOKEN_BUCKETS:
        tokens = PREFILL_MOE_TOKENS if first == TOKEN_BUCKETS[-1] else first
        x = torch.randn(tokens, hidden, device=dev, dtype=dt)
        weights, ids = softmax_topk(torch.randn(tokens, experts, device=dev), cfg.num_experts_per_tok, True)
        row = {c.as_args(): ms_unless_too_big(lambda: op(x, stacks.w13, stacks.w2, weights, ids, [1, *c.as_args()],
                                                          *stacks.optional()), c)
               for c in moe_candidates(stored)}
        params[f"fused_moe@{first}"] = min((c for c in row if row[c] is not None), key=row.get)
        times[tokens] = row
    return BackendChoice("triton", params), times


def moe_candidates(stored) -> tuple:
    """The fused MoE configs a format's kernels can run: a K step inside one 128x128 block (fp8 blocks), over whole
    groups of 32 (mxfp4)."""
    from atom_aot.ops.fp8 import BLOCK
    from atom_aot.ops.mxfp4 import BLOCK as MXFP4_BLOCK
    from atom_aot.ops.triton.fused_moe import CANDIDATE_CONFIGS
    if stored.scale == "block":
        return tuple(c for c in CANDIDATE_CONFIGS if BLOCK % c.block_k == 0)
    if stored.scale == "mxfp4":
        return tuple(c for c in CANDIDATE_CONFIGS if c.block_k % MXFP4_BLOCK == 0)
    return CANDIDATE_CONFIGS


def random_expert_stacks(stored, experts: int, inter: int, hidden: int, dtype: torch.dtype, dev: str):
    """One layer's experts of random values in the format `stored` (ops/expert_formats.py), as an ExpertWeights:
    normal bf16 weights of unit-variance products (quantized to e4m3 for fp8), random mxfp4 bytes with exponents
    around 2^-5 (the weight spread of a trained layer of this size)."""
    from atom_aot.ops.fp8 import quantize_expert_stack
    from atom_aot.ops.moe import ExpertWeights
    if stored.scale == "mxfp4":
        def packed(rows, cols):
            return (torch.randint(0, 256, (experts, rows, cols // 2), dtype=torch.uint8, device=dev),
                    torch.randint(120, 124, (experts, rows, cols // 32), dtype=torch.uint8, device=dev))
        (w13, s13), (w2, s2) = packed(2 * inter, hidden), packed(hidden, inter)
        return ExpertWeights(w13, w2, s13, s2)
    w13 = torch.randn(experts, 2 * inter, hidden, device=dev, dtype=dtype) * hidden ** -0.5
    w2 = torch.randn(experts, hidden, inter, device=dev, dtype=dtype) * inter ** -0.5
    if stored.scale == "none":
        return ExpertWeights(w13, w2)
    (w13, s13), (w2, s2) = (quantize_expert_stack(w, blocks=stored.scale == "block") for w in (w13, w2))
    return ExpertWeights(w13, w2, s13, s2)
