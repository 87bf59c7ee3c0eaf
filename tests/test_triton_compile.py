"""The kernels compile ahead of time for Hopper (sm90) and MI300 (gfx942), without a GPU.

The interpreter runs kernels as numpy and accepts code that Triton's compiler rejects; here each
kernel is compiled for the real targets at model shapes (Qwen3-0.6B / Llama-3.1-8B heads, bf16,
bf16 and fp8 caches), and register spills to local memory fail the test. Runs in a subprocess:
the other test files turn on TRITON_INTERPRET, which replaces the kernels with interpreted ones.
The selected tests' checks run side by side in single-threaded compiler processes, one per usable CPU, each
taking check after check (one after another they took ~200 CPU-s, the longest file of the suite; a process per
check paid ~4 s of imports for each, for checks of 1 to 30 s of compiling).
"""
import json
import os
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from atom_aot.runtime.threads import usable_cpus

pytest.importorskip("triton")
import triton_aot_check  # noqa: E402  (tests/ is on the path: conftest.py)
ROOT = Path(__file__).resolve().parents[1]


class Compilers:
    """A triton_aot_check.py process per pool thread, kept up between checks (`--stdin`): a check sent to it
    compiles there, so each process imports torch, Triton and the kernels once."""

    def __init__(self):
        self.local, self.started = threading.local(), []

    def compile_kernels(self, *flags: str) -> list[dict]:
        process = getattr(self.local, "process", None) or self._start()
        watchdog = threading.Timer(600, process.kill)       # a hung compile fails its test, as a timeout did
        watchdog.start()
        try:
            process.stdin.write(json.dumps(flags) + "\n")
            process.stdin.flush()
            for line in process.stdout:
                if line.startswith(triton_aot_check.RESULTS):
                    return json.loads(line[len(triton_aot_check.RESULTS):])
        finally:
            watchdog.cancel()
        process.wait()
        self.local.stderr.seek(0)
        raise AssertionError(f"{flags}: exit code {process.returncode}\n{self.local.stderr.read()[-4000:]}")

    def _start(self) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        self.local.stderr = tempfile.TemporaryFile("w+")
        process = self.local.process = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "triton_aot_check.py"), "--stdin"], env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.local.stderr)
        self.started.append(process)
        return process

    def close(self) -> None:
        for process in self.started:
            process.stdin.close()
            process.wait(60)


CHECKS = {   # a test's `check` -> the flags of its triton_aot_check.py check, longest first (sent first)
    "int4": ("--targets", "sm90,gfx942", "--int4"),
    "all-candidates": ("--model", "qwen3-0.6b", "--targets", "sm90", "--all-candidates"),
    "all-reduce-norm": ("--targets", "sm90,gfx942", "--all-reduce-norm"),
    "small-m": ("--targets", "sm90", "--small-m"),
    "silu-mul-quant": ("--targets", "sm90,gfx942", "--silu-mul-quant"),
    "moe-glue": ("--targets", "sm90,gfx942", "--moe-glue"),
    "rms-norm-quant": ("--targets", "sm90,gfx942", "--rms-norm-quant"),
    "moe-mxfp4": ("--targets", "sm90", "--moe-mxfp4"),
    "mla-mixed": ("--targets", "sm90", "--mla-mixed"),
    "fp8-cache": ("--model", "llama-3.1-8b", "--targets", "sm90,gfx942", "--fp8-cache"),
    "bf16-cache": ("--model", "llama-3.1-8b", "--targets", "sm90,gfx942"),
    "partial-rotary": ("--model", "glm-4.5-air", "--targets", "sm90,gfx942"),
    "gpt-oss": ("--targets", "sm90,gfx942", "--gpt-oss"),
    "sampling": ("--targets", "sm90,gfx942", "--sampling"),
}


@pytest.fixture(scope="module")
def compiled(request):
    """check -> the future of its results, for every check a selected test of this file names."""
    specs = [getattr(item, "callspec", None) for item in request.session.items if item.module is request.module]
    selected = {spec.params["check"] for spec in specs if spec is not None and "check" in spec.params}
    pool, compilers = ThreadPoolExecutor(max_workers=usable_cpus()), Compilers()
    try:
        yield {check: pool.submit(compilers.compile_kernels, *flags) for check, flags in CHECKS.items()
               if check in selected}
    finally:
        pool.shutdown(cancel_futures=True)      # a run stopped early (-x) starts no further compiles
        compilers.close()


def assert_compiled_without_spills(results):
    assert results
    for usage in results:
        assert "error" not in usage, usage
        assert usage.get("local_bytes", 0) == 0 and usage.get("vgpr_spills", 0) == 0, usage


@pytest.mark.parametrize("check", ["bf16-cache", "fp8-cache", "partial-rotary"])
def test_default_configs_compile_for_sm90_and_gfx942(compiled, check):
    results = compiled[check].result()
    assert {r["kernel"] for r in results} == {"paged_attention_kernel", "merge_splits_kernel",
                                             "qk_norm_rope_cache_write_kernel"}
    assert_compiled_without_spills(results)


@pytest.mark.parametrize("check", ["all-candidates"])
def test_every_candidate_compiles_for_sm90(compiled, check):
    assert_compiled_without_spills(compiled[check].result())


@pytest.mark.parametrize("check", ["small-m"])
def test_small_m_candidates_compile_for_sm90(compiled, check):
    """Every small-M GEMM config (and its split-K reduce) at Llama-3.1-8B's down_proj, fp8 per-channel and
    block-scaled and int8, within the registers (no spills) and shared memory of an H100."""
    results = compiled[check].result()
    assert {r["kernel"] for r in results} == {"small_m_gemm_kernel", "split_k_reduce_kernel"}
    assert {r["constexprs"]["INT8"] for r in results if "INT8" in r["constexprs"]} == {False, True}
    assert_compiled_without_spills(results)
    assert max(r["shared_bytes"] for r in results) <= 227 * 1024


@pytest.mark.parametrize("check", ["all-reduce-norm"])
def test_the_fused_all_reduce_norm_compiles_for_sm90_and_gfx942(compiled, check):
    """The all-reduce + residual add + RMSNorm kernel (peer loads, system-scope signals) at hidden sizes 2048 to
    8192 over 2, 4 and 8 ranks, within the registers of both targets."""
    results = compiled[check].result()
    assert {r["kernel"] for r in results} == {"all_reduce_add_rms_norm_kernel"}
    assert len(results) == 4 * 3 * 2
    assert_compiled_without_spills(results)


@pytest.mark.parametrize("check", ["moe-glue"])
def test_the_moe_sort_and_routers_compile_for_sm90_and_gfx942(compiled, check):
    """The MoE op's counting sort by expert and the softmax / DeepSeek routers (loops with loaded bounds, scalars
    carried through them, k picks unrolled) at Qwen3-30B-A3B's, Mixtral's, DeepSeek-V3's, Kimi-K2's and GLM-4.5's
    expert counts."""
    results = compiled[check].result()
    assert {r["kernel"] for r in results} == {"sort_by_expert_kernel", "softmax_topk_kernel",
                                             "grouped_sigmoid_topk_kernel"}
    assert len(results) == 10 * 2
    assert_compiled_without_spills(results)


@pytest.mark.parametrize("check", ["gpt-oss"])
def test_attention_with_sinks_and_a_window_compiles_for_sm90_and_gfx942(compiled, check):
    """GPT-OSS's layers: the default prefill and decode configs with sinks and a 128-token window (the split
    decode's merge kernel beside them)."""
    results = compiled[check].result()
    attention = [r for r in results if r["kernel"] == "paged_attention_kernel"]
    assert len(attention) == 2 * 2 and all(r["constexprs"]["HAS_SINKS"] and r["constexprs"]["SLIDING"]
                                           for r in attention)
    assert_compiled_without_spills(results)


@pytest.mark.parametrize("check", ["moe-mxfp4"])
def test_the_fused_moe_gemms_on_mxfp4_experts_compile_for_sm90(compiled, check):
    """Gate-up and down on mxfp4 experts with biases at GPT-OSS-20B's shapes, one config of each tile kind the build
    times (triton_aot_check.py MXFP4_CHECKED; `--moe-mxfp4 --all-candidates` compiles every one): within an H100's
    registers and shared memory, and the bytes widen without int -> float conversions (the kernels' two or three
    are in their index arithmetic, outside the K loop, as in the bf16 kernels)."""
    results = compiled[check].result()
    assert sorted(r["kernel"] for r in results) == ["moe_down_kernel"] * 4 + ["moe_gate_up_kernel"] * 4
    assert {r["constexprs"]["SCALES"] for r in results} == {3} and all(r["constexprs"]["HAS_BIAS"] for r in results)
    assert_compiled_without_spills(results)
    assert max(r["shared_bytes"] for r in results) <= 227 * 1024
    assert all(r["int_to_float_instructions"] <= 3 for r in results)


@pytest.mark.parametrize("check", ["sampling"])
def test_the_sampling_threshold_kernels_compile_for_sm90_and_gfx942(compiled, check):
    """The sampler's threshold search passes (a [BLOCK, PIVOTS] compare per load, int32 counts or float64 masses
    per lane, libdevice's exp) and the per-row threshold at 256 rows of Qwen3's vocabulary, within the registers of
    both targets."""
    results = compiled[check].result()
    assert sorted(r["kernel"] for r in results) == ["search_pass_kernel"] * 4 + ["threshold_kernel"] * 2
    assert_compiled_without_spills(results)


@pytest.mark.parametrize("check", ["silu-mul-quant"])
def test_the_silu_mul_quant_kernel_compiles_for_sm90_and_gfx942(compiled, check):
    """The one-pass SiLU-mul + fp8 quantization holds a row in registers: at Qwen3-0.6B's, Llama-3.1-8B's and
    DeepSeek-V3's widths (4096 to 32768 lanes) and every warp count the build measures, no spills."""
    results = compiled[check].result()
    assert {r["kernel"] for r in results} == {"silu_mul_quant_kernel"} and len(results) == 3 * 4 * 2
    assert_compiled_without_spills(results)


@pytest.mark.parametrize("check", ["rms-norm-quant"])
def test_the_rms_norm_quant_kernel_compiles_for_sm90_and_gfx942(compiled, check):
    """The one-pass residual add + RMSNorm + fp8 quantization holds a row in registers: at Qwen3-0.6B's,
    Llama-3.1-8B's and DeepSeek-V3's hidden sizes and every warp count the build measures, no spills."""
    results = compiled[check].result()
    assert {r["kernel"] for r in results} == {"add_rms_norm_quant_kernel"} and len(results) == 3 * 3 * 2
    assert_compiled_without_spills(results)


@pytest.mark.parametrize("check", ["int4"])
def test_int4_gemms_compile_for_sm90_without_conversions_and_for_gfx942(compiled, check):
    """Every int4 GEMM config (large-M and small-M with its split-K reduce) at Llama-3.1-8B's down_proj, groups of
    128 and per channel, bf16 (fp16: each kernel's first config): within an H100's registers (no spills) and shared memory, and with no
    int -> float conversion instruction in the SASS (the nibbles widen by bit patterns: what bound the kernel's
    first form). On gfx942 they
    compile (the 128 x 128 x 64 grouped large-M config spills 9 VGPRs there; no AMD device measures it)."""
    results = compiled[check].result()
    assert {r["kernel"] for r in results} == {"int4_gemm_kernel", "int4_small_m_kernel", "split_k_reduce_kernel"}
    assert {r["constexprs"]["GROUPS"] for r in results if "GROUPS" in r["constexprs"]} == {1, 112}
    assert_compiled_without_spills([r for r in results if r["target"] == "sm90"])
    assert max(r["shared_bytes"] for r in results if r["target"] == "sm90") <= 227 * 1024
    assert all(r["int_to_float_instructions"] == 0 for r in results if r["target"] == "sm90")
    assert all("error" not in r for r in results if r["target"] == "gfx942")


@pytest.mark.parametrize("check", ["mla-mixed"])
def test_the_mla_mixed_kernels_compile_for_sm90(compiled, check):
    """The MLA mixed step's causal chunk kernel (q 192 wide, v 128; the workspace's keys, then the chunk's),
    absorbed prefix kernel (q_lat and its accumulator 512 wide, W_UK / W_UV in pieces in the loops before and after
    the key loop) and prefix-workspace kernel (the up-projection: nope- and v-wide accumulators) at DeepSeek-V3's
    shapes: the first candidates over a bf16 cache with no register spills, the prefix and workspace kernels over an
    fp8 cache too (every candidate of the three compiled once by hand: docs/kernels.md)."""
    results = compiled[check].result()
    assert [r["kernel"] for r in results] == (["mla_chunk_kernel"] + ["mla_prefix_kernel"] * 2
                                              + ["mla_prefix_workspace_kernel", "mla_prefix_kernel",
                                                 "mla_prefix_workspace_kernel"])
    assert_compiled_without_spills(results)
    assert all(r["stack_bytes"] == 0 for r in results[:4]), results           # bf16: not even a stack frame
