#!/usr/bin/env bash
# Session 30, call B (carry .vllm/bundle.part04): our side, shared sbs.py: Llama-3.1-8B bf16 and FP8 at 256 x 1024/512
# with batch-1 TPOT, then FP8 at 1000 x 1000/1000 (all prompts at once: the "max load" workload).
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s); M=/tmp/m/llama-3.1-8b
timeout 150 python3 /tmp/sbs.py ours --model $M --artifact /tmp/art/llama-bf16 --out $OUT/sbs-ours-llama-bf16.json --sections throughput,tpot > $OUT/sbs-ours-bf16.log 2>&1
echo "ours bf16 rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|tpot_s\"|init_s|rror" $OUT/sbs-ours-bf16.log | tail -4
timeout 130 python3 /tmp/sbs.py ours --model $M --artifact /tmp/art/llama-fp8 --out $OUT/sbs-ours-llama-fp8.json --sections throughput,tpot > $OUT/sbs-ours-fp8.log 2>&1
echo "ours fp8 rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|tpot_s\"|init_s|rror" $OUT/sbs-ours-fp8.log | tail -4
timeout $(( 580 - ($(date +%s) - S) )) python3 /tmp/sbs.py ours --model $M --artifact /tmp/art/llama-fp8 --out $OUT/sbs-ours-llama-fp8-1000x1000.json \
  --sections throughput --num-prompts 1000 --input-len 1000 --output-len 1000 > $OUT/sbs-ours-fp8-1000.log 2>&1
echo "ours fp8 1000x1000 rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|init_s|rror" $OUT/sbs-ours-fp8-1000.log | tail -3
