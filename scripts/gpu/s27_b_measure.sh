#!/usr/bin/env bash
# Session 26, second machine, call B (carry .vllm/sbs.py): our FP8 artifact through the shared harness (its first
# run: the first machine's start failed on misaligned FP8 weights); the bf16 artifact with vLLM's token budget
# (16384 tokens per step); the bf16 decode-step profile at batch 256; what TP shows on one GPU.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s)
timeout 150 python3 .vllm/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama-fp8.atom --out $OUT/sbs-ours-llama-3.1-8b-fp8.json --sections throughput,tpot > $OUT/sbs-fp8.log 2>&1; grep -E "tok_s|tpot_s\"|Error" $OUT/sbs-fp8.log | tail -4
echo "fp8 at $(( $(date +%s) - S )) s"
timeout 120 python3 .vllm/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama.atom --out $OUT/sbs-ours-llama-3.1-8b-16k.json --sections throughput --engine-kwargs '{"max_num_batched_tokens": 16384}' > $OUT/sbs-16k.log 2>&1; grep -E "tok_s|Error" $OUT/sbs-16k.log | tail -3
echo "bf16 16k at $(( $(date +%s) - S )) s"
timeout 120 python3 scripts/profile_decode.py --artifact /tmp/art/llama.atom --out $OUT/profile-llama-b256.json --sections step,kernels > $OUT/profile.log 2>&1; grep -v -i warn $OUT/profile.log | tail -12
echo "profile at $(( $(date +%s) - S )) s"
timeout 150 python3 scripts/gpu/tp_one_gpu.py --out $OUT/tp-one-gpu.json > $OUT/tp.log 2>&1; grep -E "equal|backend|build_s|start_on|error" $OUT/tp.log | head -10
echo "call B total: $(( $(date +%s) - S )) s"
