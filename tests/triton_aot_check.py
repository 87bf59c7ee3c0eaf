"""Compile the atom_triton kernels for a GPU target on a machine without one (run by
tests/test_triton_compile.py as `python tests/triton_aot_check.py ...`, so compiled, not interpreted).

The interpreter checks what a kernel computes, not whether Triton can compile it (early returns,
loops with loaded bounds, dot shapes) nor what it costs in registers. Here a launcher runs on
`meta` tensors with `wrap_triton` swapped for a recorder, and each recorded launch is compiled
ahead of time with `triton.compile` for a named target (sm90, gfx942, ...): the NVIDIA backend
ships ptxas and the AMD one its linker, so no driver or device is involved.
"""
from __future__ import annotations

import contextlib
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from atom_aot.build.tune_fp8 import small_m_configs
from atom_aot.distributed.peer_table import TABLE_SIZE
from atom_aot.ops.triton import (all_reduce_norm, fused_moe, int4_gemm, int4_small_m, mla_prefill, mla_workspace,
                                 moe_routing, paged_attention, rms_norm_quant, rope_cache, sampling_threshold,
                                 silu_mul_quant, small_m_gemm)

TARGETS = {
    "sm90": GPUTarget("cuda", 90, 32),
    "gfx942": GPUTarget("hip", "gfx942", 64),
    "gfx950": GPUTarget("hip", "gfx950", 64),
}
POINTER_TYPES = {torch.float64: "*fp64", torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16",
                 torch.float8_e4m3fnuz: "*fp8e4b8",
                 torch.float8_e4m3fn: "*fp8e4nv", torch.int8: "*i8", torch.uint8: "*u8", torch.int32: "*i32", torch.int64: "*i64"}


@dataclass
class Launch:
    kernel: object                  # the @triton.jit function
    grid: tuple
    args: dict                      # parameter name -> value (tensors on `meta`)
    options: dict = field(default_factory=dict)   # num_warps, num_stages


def record_launches(module, launcher, *args, **kwargs) -> list[Launch]:
    """Runs `launcher` (which calls `module.wrap_triton(kernel)[grid](...)`; `module` may be a tuple of the modules
    whose launchers it calls) without launching."""
    launches: list[Launch] = []

    def wrap(kernel):
        class Indexed:
            def __getitem__(self, grid):
                def call(*call_args, **call_kwargs):
                    options = {k: call_kwargs.pop(k) for k in ("num_warps", "num_stages") if k in call_kwargs}
                    named = dict(zip(kernel.arg_names, call_args)) | call_kwargs
                    launches.append(Launch(kernel, grid, named, options))
                return call
        return Indexed()

    with contextlib.ExitStack() as patched:
        for m in module if isinstance(module, tuple) else (module,):
            patched.enter_context(mock.patch.object(m, "wrap_triton", wrap))
        launcher(*args, **kwargs)
    return launches


def _source(launch: Launch) -> ASTSource:
    signature, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(launch.kernel.params):
        value = launch.args[param.name]
        if param.is_constexpr:
            signature[param.name], constexprs[param.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = POINTER_TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]     # torch allocations are 16-byte aligned
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0 and value != 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[param.name] = "fp32"
        else:
            raise TypeError(f"{param.name}: cannot type {type(value).__name__} for compilation")
    return ASTSource(launch.kernel, signature, constexprs, attrs)


def compile_launch(launch: Launch, target: str) -> dict:
    """Compiles one launch for `target`; returns its resource use (registers, spills, shared memory)."""
    compiled = triton.compile(_source(launch), target=TARGETS[target], options=dict(launch.options))
    usage = {"kernel": launch.kernel.fn.__name__, "target": target, **launch.options,
             "shared_bytes": compiled.metadata.shared}
    if TARGETS[target].backend == "cuda":
        usage |= _cuda_usage(compiled.asm["cubin"])
    else:
        usage |= _amd_usage(compiled.asm["amdgcn"])
    return usage


def _cuda_usage(cubin: bytes) -> dict:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True).stdout
    found = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", text))
    return {"registers": int(found.get("REG", -1)), "stack_bytes": int(found.get("STACK", -1)),
            "local_bytes": int(found.get("LOCAL", -1)),
            "int_to_float_instructions": len(re.findall(r"\bI2FP?[.\s]", sass))}   # I2F / I2FP (the int4 GEMMs: none)


def _amd_usage(amdgcn: str) -> dict:
    def field_value(name):
        match = re.search(rf"\.{name}:\s+(\d+)", amdgcn)
        return int(match.group(1)) if match else -1
    return {"registers": field_value("vgpr_count"), "vgpr_spills": field_value("vgpr_spill_count"),
            "sgpr_spills": field_value("sgpr_spill_count")}


def model_launches(num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype = torch.bfloat16,
                   cache_dtype: torch.dtype | None = None, attention_configs=(), rope_config=None,
                   rotary_dim: int | None = None) -> list[Launch]:
    """The launches one decoder layer's attention makes with the given configs (meta tensors, nothing runs);
    `rotary_dim`: rope on that many of each head's dims (partial rotary), all of them by default."""
    meta = dict(device="meta")
    tokens, seqs = 64, 8
    q = torch.empty(tokens, num_heads, head_dim, dtype=dtype, **meta)
    k = torch.empty(tokens, num_kv_heads, head_dim, dtype=dtype, **meta)
    cache = torch.empty(2, 2, 4096, 16, num_kv_heads, head_dim, dtype=cache_dtype or dtype, **meta)
    int32, int64 = dict(dtype=torch.int32, **meta), dict(dtype=torch.int64, **meta)
    tables, lens, starts = torch.empty(seqs, 512, **int32), torch.empty(seqs, **int32), torch.empty(seqs + 1, **int32)
    launches = []
    for config in attention_configs:
        launches += record_launches(paged_attention, paged_attention.launch_paged_attention,
                                    q, cache, 1, tables, lens, starts, head_dim ** -0.5, *config.as_args())
    if rope_config is not None:
        norm_w = torch.empty(head_dim, dtype=dtype, **meta)
        launches += record_launches(rope_cache, rope_cache.launch_qk_norm_rope_cache_write,
                                    q, k, k, torch.empty(tokens, **int64), torch.empty(8192, rotary_dim or head_dim,
                                                                                       **meta),
                                    norm_w, norm_w, 1e-6, cache, 1, torch.empty(tokens, **int64),
                                    *rope_config.as_args())
    return launches


def small_m_launches(n: int = 4096, k: int = 14336, m: int = 1) -> list[Launch]:
    """Every small-M GEMM candidate at one of Llama-3.1-8B's shapes (down_proj): fp8 per-channel, fp8
    128x128 blocks (the configs with block_k dividing 128) and int8 (meta tensors, nothing runs)."""
    meta = dict(device="meta")
    layouts = {"fp8 channel": (torch.float8_e4m3fn, torch.empty(m, 1, **meta), torch.empty(n, **meta)),
               "fp8 block": (torch.float8_e4m3fn, torch.empty(m, k // 128, **meta),
                             torch.empty(-(-n // 128), k // 128, **meta)),
               "int8": (torch.int8, torch.empty(m, 1, **meta), torch.empty(n, **meta))}
    launches = []
    for config in small_m_gemm.CANDIDATE_CONFIGS:
        for layout, (dtype, x_scale, weight_scale) in layouts.items():
            if layout == "fp8 block" and 128 % config[1]:
                continue
            xq, weight = torch.empty(m, k, dtype=dtype, **meta), torch.empty(n, k, dtype=dtype, **meta)
            launches += record_launches(small_m_gemm, small_m_gemm.launch_small_m_gemm, xq, x_scale, weight,
                                        weight_scale, None, torch.bfloat16, *config)
    return launches


def all_reduce_norm_launches(hidden_sizes=(2048, 4096, 7168, 8192), worlds=(2, 4, 8)) -> list[Launch]:
    """The fused all-reduce + add + RMSNorm at the hidden sizes of Qwen3-30B-A3B, Llama-3.1-8B, DeepSeek-V3 and
    Llama-3.1-70B, over 2, 4 and 8 ranks (meta tensors, nothing runs)."""
    meta = dict(device="meta")
    launches = []
    for hidden in hidden_sizes:
        for world in worlds:
            x = torch.empty(16, hidden, dtype=torch.bfloat16, **meta)
            launches += record_launches(all_reduce_norm, all_reduce_norm.launch_all_reduce_add_rms_norm, x, x, x,
                                        torch.empty(hidden, dtype=torch.bfloat16, **meta),
                                        torch.empty(TABLE_SIZE, dtype=torch.int64, **meta), 1e-5, world)
    return launches


def moe_glue_launches() -> list[Launch]:
    """The MoE op's sort by expert and the two routers at the shapes of Qwen3-30B-A3B (128 experts, top 8),
    Mixtral (8, top 2), DeepSeek-V3 (256 in 8 groups, top 4 groups, top 8), Kimi-K2 (384 in one group, top 8)
    and GLM-4.5 (160 in one group, top 8) (meta tensors, nothing runs)."""
    meta = dict(device="meta")
    launches = []
    for experts, top_k in ((128, 8), (8, 2), (256, 8), (384, 8)):
        launches += record_launches(fused_moe, fused_moe.sort_by_expert,
                                    torch.empty(256, top_k, dtype=torch.int32, **meta), experts)
    for experts, top_k in ((128, 8), (8, 2)):
        launches += record_launches(moe_routing, moe_routing.launch_softmax_topk,
                                    torch.empty(256, experts, dtype=torch.bfloat16, **meta), top_k, True)
    for experts, groups, topk_groups in ((256, 8, 4), (384, 1, 1), (160, 1, 1)):
        launches += record_launches(moe_routing, moe_routing.launch_grouped_sigmoid_topk,
                                    torch.empty(256, experts, **meta), torch.empty(experts, **meta), groups,
                                    topk_groups, 8, True, 2.5)
    launches += record_launches(moe_routing, moe_routing.launch_softmax_topk,      # GPT-OSS-20B's: 32, top 4
                                torch.empty(256, 32, dtype=torch.bfloat16, **meta), 4, False, True)
    return launches


# one of each kind of tile the build times on mxfp4 experts: short rows with deep K, wide N on 8 warps, long tiles
MXFP4_CHECKED = (fused_moe.MoEConfig(16, 64, 128, 1, 4, 4), fused_moe.MoEConfig(16, 64, 256, 1, 4, 2),
                 fused_moe.MoEConfig(16, 128, 128, 1, 8, 2), fused_moe.MoEConfig(128, 128, 64, 8, 8, 3))


def moe_mxfp4_launches(all_candidates: bool = False) -> list[Launch]:
    """The fused MoE GEMMs (gate-up and down) on mxfp4 experts with biases at GPT-OSS-20B's shapes (32 experts, top 4,
    hidden and expert width 2880, bf16 activations): MXFP4_CHECKED's configs, or every candidate the build times for
    mxfp4 (meta tensors)."""
    from atom_aot.build.tune import moe_candidates
    from atom_aot.ops.expert_formats import FORMATS
    meta = dict(device="meta")
    experts, hidden, inter, top_k, tokens = 32, 2880, 2880, 4, 256
    x = torch.empty(tokens, hidden, dtype=torch.bfloat16, **meta)
    stacks = [torch.empty(experts, 2 * inter, hidden // 2, dtype=torch.uint8, **meta),
              torch.empty(experts, hidden, inter // 2, dtype=torch.uint8, **meta)]
    scales = [torch.empty(experts, 2 * inter, hidden // 32, dtype=torch.uint8, **meta),
              torch.empty(experts, hidden, inter // 32, dtype=torch.uint8, **meta)]
    biases = [torch.empty(experts, 2 * inter, **meta), torch.empty(experts, hidden, **meta)]
    routing = (torch.empty(tokens, top_k, **meta), torch.empty(tokens, top_k, dtype=torch.int32, **meta))
    launches = []
    for config in moe_candidates(FORMATS["mxfp4"]) if all_candidates else MXFP4_CHECKED:
        launches += [launch for launch in record_launches(fused_moe, fused_moe.launch_fused_moe, x, *stacks, *routing,
                                                          [1, *config.as_args()], *scales, *biases)
                     if launch.kernel is not fused_moe.sort_by_expert_kernel]
    return launches


def gpt_oss_attention_launches() -> list[Launch]:
    """Paged attention with sinks and a 128-token window at GPT-OSS's heads (64 over 8 of 64), each default config,
    bf16 cache (meta tensors, nothing runs)."""
    meta = dict(device="meta")
    num_heads, num_kv_heads, head_dim, tokens, seqs = 64, 8, 64, 64, 8
    q = torch.empty(tokens, num_heads, head_dim, dtype=torch.bfloat16, **meta)
    cache = torch.empty(2, 2, 4096, 16, num_kv_heads, head_dim, dtype=torch.bfloat16, **meta)
    int32 = dict(dtype=torch.int32, **meta)
    tables, lens, starts = torch.empty(seqs, 512, **int32), torch.empty(seqs, **int32), torch.empty(seqs + 1, **int32)
    launches = []
    for config in paged_attention.DEFAULT_CONFIGS.values():
        launches += record_launches(paged_attention, paged_attention.launch_paged_attention, q, cache, 1, tables,
                                    lens, starts, head_dim ** -0.5, *config.as_args(),
                                    sinks=torch.empty(num_heads, **meta), sliding_window=128)
    return launches


def sampling_launches() -> list[Launch]:
    """The sampler's threshold kernels at 256 rows of Qwen3's 151,936-entry vocabulary (meta tensors): one launch
    per kernel and constexprs (the passes differ only in runtime ints)."""
    meta = dict(device="meta")
    rows = 256
    launches = record_launches(sampling_threshold, sampling_threshold.launch_sampling_threshold,
                               torch.empty(rows, 151936, **meta), torch.empty(rows, dtype=torch.int64, **meta),
                               torch.empty(rows, **meta), torch.empty(rows, **meta))
    distinct = {}
    for launch in launches:
        constexprs = tuple((p.name, launch.args[p.name]) for p in launch.kernel.params if p.is_constexpr)
        distinct.setdefault((launch.kernel.fn.__name__, constexprs), launch)
    return list(distinct.values())


def silu_mul_quant_launches(widths=(3072, 14336, 18432)) -> list[Launch]:
    """The one-pass SiLU-mul + fp8 quantization at Qwen3-0.6B's, Llama-3.1-8B's and DeepSeek-V3's MLP widths
    (rows of 4096, 16384 and 32768 lanes), each warp count the build measures."""
    launches = []
    for width in widths:
        for warps in silu_mul_quant.CANDIDATE_WARPS:
            launches += record_launches(silu_mul_quant, silu_mul_quant.launch_silu_mul_quant,
                                        torch.empty(256, 2 * width, dtype=torch.bfloat16, device="meta"), warps)
    return launches


def rms_norm_quant_launches(widths=(1024, 4096, 7168)) -> list[Launch]:
    """The one-pass residual add + RMSNorm + fp8 quantization at Qwen3-0.6B's, Llama-3.1-8B's and DeepSeek-V3's
    hidden sizes, each warp count the build measures."""
    launches = []
    for width in widths:
        for warps in rms_norm_quant.CANDIDATE_WARPS:
            x = torch.empty(256, width, dtype=torch.bfloat16, device="meta")
            launches += record_launches(rms_norm_quant, rms_norm_quant.launch_add_rms_norm_quant, x, x, x[0], 1e-6,
                                        warps)
    return launches


def int4_launches(n: int = 4096, k: int = 14336) -> list[Launch]:
    """Every int4 GEMM config at Llama-3.1-8B's down_proj in bf16, groups of 128 and per channel: the large-M kernel
    at 2048 tokens, the small-M one (and its split-K reduce) at 1 token; in fp16 (the other bias) each kernel's
    first config, grouped."""
    launches = []
    cases = ((torch.bfloat16, k // 128, None), (torch.bfloat16, 1, None), (torch.float16, k // 128, 1))
    for dtype, groups, configs in cases:     # configs: how many of each kernel's candidates (None: all)
        weight = torch.empty(n, k // 2, dtype=torch.uint8, device="meta")
        scale = torch.empty(n, groups, dtype=torch.float32, device="meta")
        zero = torch.empty(n, groups, dtype=torch.uint8, device="meta")
        for config in int4_gemm.CANDIDATE_CONFIGS[:configs]:
            x = torch.empty(2048, k, dtype=dtype, device="meta")
            launches += record_launches(int4_gemm, int4_gemm.launch_int4_linear, x, weight, scale, zero, None,
                                        *config.as_args())
        for config in small_m_configs("int4-w4a16-channel" if groups == 1 else "int4-w4a16")[:configs]:
            x = torch.empty(1, k, dtype=dtype, device="meta")
            launches += record_launches(int4_small_m, int4_small_m.launch_int4_small_m, x, weight, scale, zero, None,
                                        *config)
    return launches


def mla_mixed_launches(chunks=mla_prefill.CHUNK_CANDIDATES[:1], prefixes=mla_prefill.PREFIX_CANDIDATES[:2],
                       workspaces=mla_workspace.WORKSPACE_CANDIDATES[:1]) -> list[Launch]:
    """The MLA mixed step's chunk, prefix and prefix-workspace kernels at DeepSeek-V3's shapes (128 heads, nope 128,
    rope 64, r 512, v 128; q_nope a view of q): `chunks`, `prefixes` and `workspaces` (at an 8192-token capacity)
    configs over a bf16 cache, the first prefix and workspace configs over an fp8 one too (meta tensors, nothing
    runs)."""
    meta, heads, tokens, seqs = dict(device="meta"), 128, 4096, 8
    bf16, i32 = dict(dtype=torch.bfloat16, **meta), dict(dtype=torch.int32, **meta)

    def one(chunk, prefix, workspace, cache_dtype) -> dict:
        cache = torch.empty(2, 1, 4096, 16, 1, 576, dtype=cache_dtype, **meta)
        workspace = mla_workspace.PrefixWorkspace(8192, *workspace.as_args()[1:])
        launches = record_launches((mla_prefill, mla_workspace), mla_prefill.launch_mla_prefill,
                               torch.empty(tokens, heads, 192, **bf16)[..., :128], torch.empty(tokens, heads, 64, **bf16),
                               torch.empty(tokens, heads, 128, **bf16), torch.empty(tokens, heads, 128, **bf16),
                               torch.empty(tokens, 64, **bf16), torch.empty(seqs * 2, heads, 128, **bf16), cache, 1,
                               torch.empty(seqs, 512, **i32), torch.empty(seqs, **i32), torch.empty(seqs + 1, **i32),
                               torch.empty(heads, 128, 512, **bf16), torch.empty(heads, 512, 128, **bf16), 0.1, 2,
                               chunk, prefix, workspace, torch.empty(2, **meta) if cache_dtype.itemsize == 1 else None)
        return {launch.kernel.fn.__name__: launch for launch in launches}
    first = (chunks[0], prefixes[0], workspaces[0])
    launches = [one(c, *first[1:], torch.bfloat16)["mla_chunk_kernel"] for c in chunks]
    launches += [one(chunks[0], p, first[2], torch.bfloat16)["mla_prefix_kernel"] for p in prefixes]
    launches += [one(*first[:2], w, torch.bfloat16)["mla_prefix_workspace_kernel"] for w in workspaces]
    fp8 = one(*first, torch.float8_e4m3fn)
    return launches + [fp8["mla_prefix_kernel"], fp8["mla_prefix_workspace_kernel"]]


MODELS = {"qwen3-0.6b": dict(num_heads=16, num_kv_heads=8, head_dim=128),
          "llama-3.1-8b": dict(num_heads=32, num_kv_heads=8, head_dim=128),
          "glm-4.5-air": dict(num_heads=96, num_kv_heads=8, head_dim=128, rotary_dim=64)}


def check(model: str, targets: list[str], cache_dtype: torch.dtype | None, all_candidates: bool,
          small_m_only: bool = False) -> list[dict]:
    """Compiles a decoder layer's launches (default or all candidate configs) for each target, or only
    the small-M GEMM's candidates."""
    if small_m_only:
        return compile_all(small_m_launches(), targets)
    if all_candidates:
        attention_configs = [c for phase in paged_attention.CANDIDATE_CONFIGS.values() for c in phase]
        rope_configs = rope_cache.CANDIDATE_CONFIGS
    else:
        attention_configs, rope_configs = list(paged_attention.DEFAULT_CONFIGS.values()), [rope_cache.DEFAULT_CONFIG]
    launches = model_launches(**MODELS[model], cache_dtype=cache_dtype, attention_configs=attention_configs)
    for rope in rope_configs:
        launches += model_launches(**MODELS[model], cache_dtype=cache_dtype, rope_config=rope)
    return compile_all(launches, targets)


def compile_all(launches: list[Launch], targets: list[str]) -> list[dict]:
    results = []
    for launch in launches:
        for target in targets:
            try:
                usage = compile_launch(launch, target)
            except Exception as e:  # noqa: BLE001  (report every failure, keep going)
                usage = {"kernel": launch.kernel.fn.__name__, "target": target, "error": repr(e)[:2000]}
            usage["constexprs"] = {p.name: launch.args[p.name] for p in launch.kernel.params if p.is_constexpr}
            results.append(usage)
    return results


RESULTS = "results: "     # the prefix of a results line in --stdin mode (the compiler may print lines of its own)


def argument_parser():
    import argparse
    parser = argparse.ArgumentParser(description="Compile the atom_triton kernels for GPU targets, no GPU needed.")
    parser.add_argument("--model", choices=sorted(MODELS), default="llama-3.1-8b")
    parser.add_argument("--targets", default="sm90,gfx942")
    parser.add_argument("--fp8-cache", action="store_true")
    parser.add_argument("--all-candidates", action="store_true")
    parser.add_argument("--small-m", action="store_true", help="only the small-M GEMM's candidates (fp8, int8)")
    parser.add_argument("--all-reduce-norm", action="store_true", help="only the fused all-reduce + RMSNorm")
    parser.add_argument("--moe-glue", action="store_true", help="only the MoE op's sort and the routers")
    parser.add_argument("--sampling", action="store_true", help="only the sampler's threshold kernel")
    parser.add_argument("--silu-mul-quant", action="store_true", help="only the one-pass SiLU-mul fp8 quantization")
    parser.add_argument("--rms-norm-quant", action="store_true", help="only the one-pass add + RMSNorm fp8 quantization")
    parser.add_argument("--int4", action="store_true", help="only the int4 GEMMs (large-M and small-M)")
    parser.add_argument("--moe-mxfp4", action="store_true", help="only the fused MoE GEMMs on mxfp4 experts")
    parser.add_argument("--mla-mixed", action="store_true", help="only the MLA mixed step's chunk, prefix and workspace kernels")
    parser.add_argument("--gpt-oss", action="store_true", help="only paged attention with sinks and a window")
    parser.add_argument("--stdin", action="store_true",
                        help="compile each flag set read from stdin (a JSON list a line), answer each with a line "
                             f"'{RESULTS}<json>': one process's imports for many checks")
    return parser


def results_for(args) -> list[dict]:
    only = {"rms_norm_quant": rms_norm_quant_launches, "silu_mul_quant": silu_mul_quant_launches,
            "sampling": sampling_launches, "all_reduce_norm": all_reduce_norm_launches,
            "moe_glue": moe_glue_launches, "int4": int4_launches, "mla_mixed": mla_mixed_launches,
            "gpt_oss": gpt_oss_attention_launches}      # flag (its dest) -> the launches it compiles alone
    chosen = [launches for flag, launches in only.items() if getattr(args, flag)]
    if args.moe_mxfp4:
        return compile_all(moe_mxfp4_launches(args.all_candidates), args.targets.split(","))
    if chosen:
        return compile_all(chosen[0](), args.targets.split(","))
    return check(args.model, args.targets.split(","), torch.float8_e4m3fn if args.fp8_cache else None,
                 args.all_candidates, args.small_m)


def main() -> None:
    import json
    import sys
    args = argument_parser().parse_args()
    if not args.stdin:
        print(json.dumps(results_for(args)))
        return
    for line in sys.stdin:
        print(RESULTS + json.dumps(results_for(argument_parser().parse_args(json.loads(line)))), flush=True)


if __name__ == "__main__":
    main()
