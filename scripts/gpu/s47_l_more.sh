#!/usr/bin/env bash
# Session 47, call L (after J and K; carry .vllm/sbs.py): ours' batch-256 decode step profiled (the row quantizers'
# kernels among the rest), then a second 1000 x 1000 / 1000 run of each engine (ours, then vLLM FP8), as
# session 46's machine 2 did.
LOGS=/tmp/s44; source scripts/gpu/prelude.sh
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
M=/tmp/m/llama-3.1-8b A=/tmp/art/llama-fp8 KW='{"quantization": "fp8", "kv_cache_dtype": "fp8", "load_format": "dummy"}'
timeout 120 python3 scripts/profile_decode.py --artifact $A --out $OUT/profile-decode-fp8.json --sections step,kernels \
  --warm-steps 16 --steps 16 > $LOGS/profile-fp8.log 2>&1; at "profile rc=$?"
grep -E "wall_ms|\"kernel\"|\"ms\"" $LOGS/profile-fp8.log | head -40 | tr -s ' ' | paste -sd' ' | cut -c1-2500
timeout 150 python3 /tmp/sbs.py ours --model $M --artifact $A --out $OUT/sbs-ours-llama-fp8-1000x1000-run2.json \
  --sections throughput --num-prompts 1000 --input-len 1000 --output-len 1000 > $LOGS/sbs-ours-fp8-1000-2.log 2>&1
at "ours 1000x1000 run 2 rc=$?"; grep -E "output_tok_s|rror" $LOGS/sbs-ours-fp8-1000-2.log | tail -2 | cut -c1-250
PYTHONPATH=/tmp/vsite timeout $(( 590 - ($(date +%s) - S) )) python3 /tmp/sbs.py vllm --model $M \
  --out $OUT/sbs-vllm-llama-fp8-1000x1000-run2.json --sections throughput --num-prompts 1000 --input-len 1000 \
  --output-len 1000 --engine-kwargs "$KW" > $LOGS/sbs-vllm-fp8-1000-2.log 2>&1
at "vllm 1000x1000 run 2 rc=$?"; grep -E "output_tok_s|rror" $LOGS/sbs-vllm-fp8-1000-2.log | tail -2 | cut -c1-250
