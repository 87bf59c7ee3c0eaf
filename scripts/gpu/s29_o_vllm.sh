#!/usr/bin/env bash
# Session 29, call O (carry .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh): install vLLM 0.24.0; vLLM on
# the same two config folders with its own random weights (load_format dummy): the 16-layer Qwen3-30B-A3B, then
# Llama-3.1-8B FP8 (quantization fp8 of the random bf16 weights at load, FP8 KV cache).
cp .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && bash /tmp/vstage/install.sh > $OUT/vllm-install.log 2>&1 || { tail -5 $OUT/vllm-install.log; exit 1; }
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
S=$(date +%s)
PYTHONPATH=/tmp/vsite timeout 300 python3 /tmp/sbs.py vllm --model /tmp/m/qwen3-30b-a3b-16l --out $OUT/sbs-vllm-qwen3-moe-16l.json \
  --sections throughput,tpot --engine-kwargs '{"load_format": "dummy"}' > $OUT/sbs-vllm-moe.log 2>&1
echo "vllm moe rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|tpot_s\"|init_s|rror" $OUT/sbs-vllm-moe.log | tail -4
PYTHONPATH=/tmp/vsite timeout $(( 560 - ($(date +%s) - S) )) python3 /tmp/sbs.py vllm --model /tmp/m/llama-3.1-8b --out $OUT/sbs-vllm-llama-3.1-8b-fp8.json \
  --sections throughput,tpot --engine-kwargs '{"quantization": "fp8", "kv_cache_dtype": "fp8", "load_format": "dummy"}' > $OUT/sbs-vllm-fp8.log 2>&1
echo "vllm fp8 rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|tpot_s\"|init_s|rror" $OUT/sbs-vllm-fp8.log | tail -4
