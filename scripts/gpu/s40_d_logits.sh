#!/usr/bin/env bash
# Session 40, call D (carry .vllm/bundle.part02): stage vLLM part 2; bf16 logits of the Llama-3.1-8B -tp 2 artifact
# (fused all-reduce + norm) against -tp 1 with the same weights (drawn at load), GPUs 0,1.
LOGS=/tmp/s40; source scripts/gpu/prelude.sh
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0,1
timeout ${LIMIT:-200} python3 scripts/gpu/tp_two_gpus.py logits --tp1 /tmp/art/llama-tp1 --tp2 /tmp/art/llama-tp2 --out $OUT/llama-logits-tp2-vs-tp1.json > $LOGS/logits.log 2>&1
at "logits rc=$?"; python3 -c "import json; d=json.load(open('$OUT/llama-logits-tp2-vs-tp1.json')); print(d.get('logits_tp2_vs_tp1', d.get('error')))" 2>&1 | cut -c1-1500
cp $LOGS/logits.log $OUT/; ls /tmp/vstage | tr '\n' ' '
