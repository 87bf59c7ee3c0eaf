#!/usr/bin/env bash
# Session 30, call I: where the Llama-3.1-8B bf16 gap lies: prefill only (256 x 1024, 1 new token) on both engines.
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
S=$(date +%s); M=/tmp/m/llama-3.1-8b
PYTHONPATH=/tmp/site:$PWD timeout 100 python3 /tmp/sbs.py ours --model $M --artifact /tmp/art/llama-bf16 --out $OUT/sbs-ours-llama-bf16-prefill.json --sections throughput --output-len 1 > $OUT/ours.log 2>&1
echo "ours rc=$? at $(( $(date +%s) - S )) s"; grep -E "\"seconds|init_s|rror" $OUT/ours.log | tail -3
PYTHONPATH=/tmp/vsite timeout 200 python3 /tmp/sbs.py vllm --model $M --out $OUT/sbs-vllm-llama-bf16-prefill.json --sections throughput --output-len 1 --engine-kwargs '{"load_format": "dummy"}' > $OUT/vllm.log 2>&1
echo "vllm rc=$? at $(( $(date +%s) - S )) s"; grep -E "\"seconds|init_s|rror" $OUT/vllm.log | tail -3
