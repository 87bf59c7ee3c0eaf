#!/usr/bin/env bash
# Planned for the next multi-GPU session, call B (carry .vllm/bundle.part00): stage vLLM part 0. Our Llama-3.1-8B
# -tp 2 start after session 36's start change (weights hashed per rank beside their upload): cold x3 through the
# shared harness and `atom-run generate`'s breakdown (`ranks start + join` now itemized);
# then -tp 4 on GPUs 0-3: cold x3, throughput 256 x 1024/512, batch-1 TPOT, and its breakdown.
mkdir -p /tmp/vstage /tmp/s36 && cp .vllm/bundle.part0* /tmp/vstage/
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s); at() { echo "$1 at $(( $(date +%s) - S )) s"; }
R="python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b"
G="python3 -m atom_aot.entrypoints.run_cli"
CUDA_VISIBLE_DEVICES=0,1 timeout 120 $R --artifact /tmp/art/llama-tp2 --out $OUT/sbs-ours-llama-tp2-cold.json --sections cold > /tmp/s36/sbs-tp2.log 2>&1
at "ours tp2 cold rc=$?"; grep -E "first_token_s|rror" /tmp/s36/sbs-tp2.log | tail -4
CUDA_VISIBLE_DEVICES=0,1 timeout 90 $G /tmp/art/llama-tp2 generate "Hello" --max-tokens 4 > /tmp/s36/generate-tp2.log 2>&1
at "generate tp2 rc=$?"; grep -E "tensor-parallel ranks|^startup" /tmp/s36/generate-tp2.log | cut -c1-500
CUDA_VISIBLE_DEVICES=0,1,2,3 timeout 330 $R --artifact /tmp/art/llama-tp4 --out $OUT/sbs-ours-llama-tp4.json --sections cold,throughput,tpot > /tmp/s36/sbs-tp4.log 2>&1
at "ours tp4 rc=$?"; grep -E "first_token_s|output_tok_s|tpot_s\"|init_s|rror" /tmp/s36/sbs-tp4.log | tail -8
grep -E "all-reduce|tensor-parallel ranks" /tmp/s36/sbs-tp4.log | sort | uniq -c | head -4 | cut -c1-300
CUDA_VISIBLE_DEVICES=0,1,2,3 timeout 90 $G /tmp/art/llama-tp4 generate "Hello" --max-tokens 4 > /tmp/s36/generate-tp4.log 2>&1
at "generate tp4 rc=$?"; grep -E "tensor-parallel ranks|^startup|^path" /tmp/s36/generate-tp4.log | cut -c1-500
cp /tmp/s36/generate-tp2.log /tmp/s36/generate-tp4.log $OUT/
