#!/usr/bin/env bash
# Session 47, one H100, call A (carry .whl .gpu/configs .gpu/tokenizers/llama3 .vllm/bundle.part05 .vllm/SHA256SUMS
# .vllm/install.sh .vllm/sbs.py): the one-pass quantizing kernels checked on the GPU first (tests/test_rms_norm_quant.py,
# new; tests/test_silu_mul_quant.py, whose scale division is back to the form session 46 measured), then the
# Llama-3.1-8B FP8 build started detached as session 44's call A (its tune stage now also times the add + RMSNorm +
# quantization kernel against Inductor's). Calls after it as session 44's: s42_b_stage.sh x4 with LOGS=/tmp/s44,
# s44_f_wait.sh, s44_j_fp8_ours.sh, s44_k_fp8_vllm.sh.
LOGS=/tmp/s44; source scripts/gpu/prelude.sh
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_rms_norm_quant.py tests/test_silu_mul_quant.py \
  > $OUT/gpu-row-quant-tests.log 2>&1
at "kernel tests rc=$?"; grep -E "passed|failed|^FAILED|^E " $OUT/gpu-row-quant-tests.log | head -12 | cut -c1-250
M=llama-3.1-8b TOK=llama3 ART=llama-fp8 BUILD_FLAGS="--quant fp8 --kv-cache-dtype fp8" bash scripts/gpu/s44_a_start.sh
