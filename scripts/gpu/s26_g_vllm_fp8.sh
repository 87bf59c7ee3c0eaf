#!/usr/bin/env bash
# Session 26, GPU call G (after F; vLLM in /tmp/vsite): vLLM FP8 (quantization=fp8, kv_cache_dtype=fp8) through the
# same harness on the same bf16 Llama folder, the counterpart of our --quant fp8 --kv-cache-dtype fp8 artifact.
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
S=$(date +%s)
PYTHONPATH=/tmp/vsite timeout 400 python3 .vllm/sbs.py vllm --model /tmp/m/llama-3.1-8b --out $OUT/sbs-vllm-llama-3.1-8b-fp8.json --sections throughput,tpot --engine-kwargs '{"quantization": "fp8", "kv_cache_dtype": "fp8"}' 2>&1 | grep -E "tok_s|tpot_s\"|init_s|seconds|Error" | head -10
echo "call G total: $(( $(date +%s) - S )) s"
