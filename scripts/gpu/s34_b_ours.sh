#!/usr/bin/env bash
# Session 34, nvidia-h100-x2 call B (carry .vllm/bundle.part01): stage vLLM part 1; our Llama-3.1-8B -tp 2 artifact
# through the shared harness (sbs.py ours: throughput 256 x 1024/512, batch-1 TPOT, cold start to first token).
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s)
timeout 560 python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama-tp2 --out $OUT/sbs-ours-llama-tp2.json \
  --sections cold,throughput,tpot > $OUT/sbs-ours.log 2>&1
echo "ours rc=$? at $(( $(date +%s) - S )) s"; grep -E "first_token_s|output_tok_s|tpot_s\"|init_s|rror" $OUT/sbs-ours.log | tail -8
