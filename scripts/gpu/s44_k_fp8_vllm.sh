#!/usr/bin/env bash
# Session 44, FP8 call K: vLLM 0.24.0 FP8 (quantization fp8, kv_cache_dtype fp8) on the same folder through the shared
# harness: 256 x 1024/512 with batch-1 TPOT, then 1000 x 1000/1000; its KV cache size from its log.
LOGS=/tmp/s44; mkdir -p $LOGS; S=$(date +%s); at() { echo "$1 at $(( $(date +%s) - S )) s"; }
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
M=/tmp/m/llama-3.1-8b KW='{"quantization": "fp8", "kv_cache_dtype": "fp8", "load_format": "dummy"}'
PYTHONPATH=/tmp/vsite timeout 250 python3 /tmp/sbs.py vllm --model $M --out $OUT/sbs-vllm-llama-fp8.json \
  --sections throughput,tpot --engine-kwargs "$KW" > $LOGS/sbs-vllm-fp8.log 2>&1
at "vllm fp8 rc=$?"; grep -E "output_tok_s|tpot_s\"|KV cache size|rror" $LOGS/sbs-vllm-fp8.log | tail -4 | cut -c1-250
PYTHONPATH=/tmp/vsite timeout $(( 590 - ($(date +%s) - S) )) python3 /tmp/sbs.py vllm --model $M --out $OUT/sbs-vllm-llama-fp8-1000x1000.json \
  --sections throughput --num-prompts 1000 --input-len 1000 --output-len 1000 --engine-kwargs "$KW" > $LOGS/sbs-vllm-fp8-1000.log 2>&1
at "vllm fp8 1000x1000 rc=$?"; grep -E "output_tok_s|rror" $LOGS/sbs-vllm-fp8-1000.log | tail -3 | cut -c1-250
