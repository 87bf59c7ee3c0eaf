#!/usr/bin/env bash
# Session 29, call K (carry .vllm/bundle.part01): our side of both side-by-sides (shared sbs.py), inspect rows.
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s)
for a in moe-16l llama-fp8; do python3 -m atom_aot.entrypoints.run_cli /tmp/art/$a inspect > $OUT/inspect-$a.txt 2>&1; done
timeout 200 python3 /tmp/sbs.py ours --model /tmp/m/qwen3-30b-a3b-16l --artifact /tmp/art/moe-16l --out $OUT/sbs-ours-qwen3-moe-16l.json --sections throughput,tpot > $OUT/sbs-ours-moe.log 2>&1
echo "ours moe rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|tpot_s\"|init_s|rror" $OUT/sbs-ours-moe.log | tail -4
timeout 150 python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama-fp8 --out $OUT/sbs-ours-llama-3.1-8b-fp8.json --sections throughput,tpot > $OUT/sbs-ours-fp8.log 2>&1
echo "ours fp8 rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|tpot_s\"|init_s|rror" $OUT/sbs-ours-fp8.log | tail -4
