"""SmolLM2-135M-Instruct with FP8 weights (W8A8) and an FP8 KV cache (calibrated scales) against
float32, by perplexity on the first 160 tokens of a fixed text (atom_aot/bench/perplexity.py); the
full text and more configs: scripts/cpu_smollm2_fp8_perplexity.py ->
docs/benchmarks/cpu-smollm2-fp8-perplexity-2026-11-23.json.

The issue's target is 2%; measured on the full text it is +4.4% (FP8 weights alone, even widened to
float32 before the GEMM, already cost +2.2% on this 135M model; the KV cache +0.3%). The bound
here guards that measurement from regressing, it does not claim the target."""
import pytest

from atom_aot.bench.perplexity import perplexity

TOKENS = 160


@pytest.mark.slow
def test_fp8_weights_and_kv_cache_perplexity_stays_near_float32(smollm2_gguf, build_artifact):
    reference, n = perplexity(build_artifact(smollm2_gguf, compile="none"), TOKENS)
    fp8, _ = perplexity(build_artifact(smollm2_gguf, compile="none", quant="fp8", kv_cache_dtype="fp8"), TOKENS)
    assert n == TOKENS - 1
    print(f"perplexity float32 {reference:.4f}, fp8 weights + fp8 kv {fp8:.4f} ({fp8 / reference - 1:+.2%})")
    assert abs(fp8 / reference - 1) < 0.06, (fp8, reference)
