#!/usr/bin/env bash
# Session 46, a second H100, call G (carry .whl .gpu/configs .gpu/tokenizers/llama3 .vllm/bundle.part05
# .vllm/SHA256SUMS .vllm/install.sh .vllm/sbs.py): the one-pass SiLU-mul + fp8 quantization kernel checked on
# the GPU (tests/test_silu_mul_quant.py, compiled), then the Llama-3.1-8B FP8 build started detached as session
# 44's call A (its tune stage now also times the kernel against Inductor's); calls after it as session 44's
# (s42_b_stage.sh x4 with LOGS=/tmp/s44, s44_f_wait.sh, s44_j_fp8_ours.sh, s44_k_fp8_vllm.sh).
LOGS=/tmp/s44; source scripts/gpu/prelude.sh
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_silu_mul_quant.py > $OUT/gpu-silu-mul-quant.log 2>&1
at "kernel tests rc=$?"; tail -3 $OUT/gpu-silu-mul-quant.log | cut -c1-300
M=llama-3.1-8b TOK=llama3 ART=llama-fp8 BUILD_FLAGS="--quant fp8 --kv-cache-dtype fp8" bash scripts/gpu/s44_a_start.sh
