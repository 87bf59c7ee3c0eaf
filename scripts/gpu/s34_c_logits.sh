#!/usr/bin/env bash
# Session 34, nvidia-h100-x2 call C (carry .vllm/bundle.part02): stage vLLM part 2; bf16 first-token log-probabilities
# and greedy tokens of the Llama-3.1-8B -tp 2 artifact against the -tp 1 one (same random draw).
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s)
timeout 300 python3 scripts/gpu/tp_two_gpus.py logits --tp1 /tmp/art/llama-tp1 --tp2 /tmp/art/llama-tp2 --out $OUT/h100x2-llama-logits-tp2-vs-tp1.json > $OUT/logits.log 2>&1
echo "logits rc=$? at $(( $(date +%s) - S )) s"; grep -E "diff|equal|rror" $OUT/logits.log | head -40
