"""The kernels compile ahead of time for Hopper (sm90) and MI300 (gfx942), without a GPU.

The interpreter runs kernels as numpy and accepts code that Triton's compiler rejects; here each
kernel is compiled for the real targets at model shapes (Qwen3-0.6B / Llama-3.1-8B heads, bf16,
bf16 and fp8 caches), and register spills to local memory fail the test. Runs in a subprocess:
the other test files turn on TRITON_INTERPRET, which replaces the kernels with interpreted ones.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]


def compile_kernels(*flags: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "triton_aot_check.py"), *flags], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.splitlines()[-1])


def assert_compiled_without_spills(results):
    assert results
    for usage in results:
        assert "error" not in usage, usage
        assert usage.get("local_bytes", 0) == 0 and usage.get("vgpr_spills", 0) == 0, usage


@pytest.mark.parametrize("flags", [(), ("--fp8-cache",)], ids=["bf16-cache", "fp8-cache"])
def test_default_configs_compile_for_sm90_and_gfx942(flags):
    results = compile_kernels("--model", "llama-3.1-8b", "--targets", "sm90,gfx942", *flags)
    assert {r["kernel"] for r in results} == {"paged_attention_kernel", "merge_splits_kernel",
                                             "qk_norm_rope_cache_write_kernel"}
    assert_compiled_without_spills(results)


def test_every_candidate_compiles_for_sm90():
    assert_compiled_without_spills(compile_kernels("--model", "qwen3-0.6b", "--targets", "sm90", "--all-candidates"))


def test_small_m_candidates_compile_for_sm90():
    """Every small-M GEMM config (and its split-K reduce) at Llama-3.1-8B's down_proj, fp8 per-channel and
    block-scaled and int8, within the registers (no spills) and shared memory of an H100."""
    results = compile_kernels("--targets", "sm90", "--small-m")
    assert {r["kernel"] for r in results} == {"small_m_gemm_kernel", "split_k_reduce_kernel"}
    assert {r["constexprs"]["INT8"] for r in results if "INT8" in r["constexprs"]} == {False, True}
    assert_compiled_without_spills(results)
    assert max(r["shared_bytes"] for r in results) <= 227 * 1024


def test_the_fused_all_reduce_norm_compiles_for_sm90_and_gfx942():
    """The all-reduce + residual add + RMSNorm kernel (peer loads, system-scope signals) at hidden sizes 2048 to
    8192 over 2, 4 and 8 ranks, within the registers of both targets."""
    results = compile_kernels("--targets", "sm90,gfx942", "--all-reduce-norm")
    assert {r["kernel"] for r in results} == {"all_reduce_add_rms_norm_kernel"}
    assert len(results) == 4 * 3 * 2
    assert_compiled_without_spills(results)


def test_the_moe_sort_and_routers_compile_for_sm90_and_gfx942():
    """The MoE op's counting sort by expert and the softmax / DeepSeek routers (loops with loaded bounds, scalars
    carried through them, k picks unrolled) at Qwen3-30B-A3B's, Mixtral's and DeepSeek-V3's expert counts."""
    results = compile_kernels("--targets", "sm90,gfx942", "--moe-glue")
    assert {r["kernel"] for r in results} == {"sort_by_expert_kernel", "softmax_topk_kernel",
                                             "grouped_sigmoid_topk_kernel"}
    assert len(results) == 6 * 2
    assert_compiled_without_spills(results)


def test_the_sampling_threshold_kernels_compile_for_sm90_and_gfx942():
    """The sampler's threshold search passes (a [BLOCK, PIVOTS] compare per load, int32 counts or float64 masses
    per lane, libdevice's exp) and the per-row threshold at 256 rows of Qwen3's vocabulary, within the registers of
    both targets."""
    results = compile_kernels("--targets", "sm90,gfx942", "--sampling")
    assert sorted(r["kernel"] for r in results) == ["search_pass_kernel"] * 4 + ["threshold_kernel"] * 2
    assert_compiled_without_spills(results)


def test_the_silu_mul_quant_kernel_compiles_for_sm90_and_gfx942():
    """The one-pass SiLU-mul + fp8 quantization holds a row in registers: at Qwen3-0.6B's, Llama-3.1-8B's and
    DeepSeek-V3's widths (4096 to 32768 lanes) and every warp count the build measures, no spills."""
    results = compile_kernels("--targets", "sm90,gfx942", "--silu-mul-quant")
    assert {r["kernel"] for r in results} == {"silu_mul_quant_kernel"} and len(results) == 3 * 4 * 2
    assert_compiled_without_spills(results)


def test_the_rms_norm_quant_kernel_compiles_for_sm90_and_gfx942():
    """The one-pass residual add + RMSNorm + fp8 quantization holds a row in registers: at Qwen3-0.6B's,
    Llama-3.1-8B's and DeepSeek-V3's hidden sizes and every warp count the build measures, no spills."""
    results = compile_kernels("--targets", "sm90,gfx942", "--rms-norm-quant")
    assert {r["kernel"] for r in results} == {"add_rms_norm_quant_kernel"} and len(results) == 3 * 3 * 2
    assert_compiled_without_spills(results)


def test_int4_gemms_compile_for_sm90_without_conversions_and_for_gfx942():
    """Every int4 GEMM config (large-M and small-M with its split-K reduce) at Llama-3.1-8B's down_proj, groups of
    128 and per channel, bf16 (fp16: each kernel's first config): within an H100's registers (no spills) and shared memory, and with no
    int -> float conversion instruction in the SASS (the nibbles widen by bit patterns: what bound the kernel's
    first form). On gfx942 they
    compile (the 128 x 128 x 64 grouped large-M config spills 9 VGPRs there; no AMD device measures it)."""
    results = compile_kernels("--targets", "sm90,gfx942", "--int4")
    assert {r["kernel"] for r in results} == {"int4_gemm_kernel", "int4_small_m_kernel", "split_k_reduce_kernel"}
    assert {r["constexprs"]["GROUPS"] for r in results if "GROUPS" in r["constexprs"]} == {1, 112}
    assert_compiled_without_spills([r for r in results if r["target"] == "sm90"])
    assert max(r["shared_bytes"] for r in results if r["target"] == "sm90") <= 227 * 1024
    assert all(r["int_to_float_instructions"] == 0 for r in results if r["target"] == "sm90")
    assert all("error" not in r for r in results if r["target"] == "gfx942")
