#!/usr/bin/env bash
# Session 26, GPU call C (carry .vllm/bundle.part02): our FP8 artifact through the shared harness; batch-1 TPOT
# with and without n-gram speculation (bf16 artifact); what TP shows on one GPU (TP-2 build, NCCL world of 1).
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s)
timeout 200 python3 .vllm/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama-fp8.atom --out $OUT/sbs-ours-llama-3.1-8b-fp8.json --sections throughput,tpot 2>&1 | grep -E "tok_s|tpot_s\"|init_s|seconds" | head -8
echo "fp8 sbs at $(( $(date +%s) - S )) s"
timeout 150 python3 scripts/gpu/spec_tpot.py --artifact /tmp/art/llama.atom --vocab 128256 --out $OUT/spec-tpot-llama-3.1-8b.json 2>&1 | grep -E "tpot_s\"|accepted length" | head -12
echo "spec at $(( $(date +%s) - S )) s"
timeout 200 python3 scripts/gpu/tp_one_gpu.py --out $OUT/tp-one-gpu.json 2>&1 | grep -E "equal|backend|build_s|start_on|error" | head -12
echo "call C total: $(( $(date +%s) - S )) s"
