#!/usr/bin/env bash
# Session 28, H100 call G: our FP8 artifact through the same harness; its batch-256 decode-step profile; the
# TP-2 build on one GPU (collectives stood in for at the probe), if time is left.
export PYTHONPATH=/tmp/site:$PWD:/tmp/vsite PYTHONUNBUFFERED=1
S=$(date +%s)
timeout 150 python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama-fp8.atom --out $OUT/sbs-ours-llama-3.1-8b-fp8.json --sections throughput,tpot > $OUT/sbs-ours-fp8.log 2>&1
echo "ours fp8 rc=$? at $(( $(date +%s) - S )) s"; grep -E "tok_s|tpot|init_s|Error" $OUT/sbs-ours-fp8.log | tail -5
timeout 150 python3 scripts/profile_decode.py --artifact /tmp/art/llama-fp8.atom --out $OUT/profile-llama-fp8-b256.json --sections step,kernels > $OUT/profile.log 2>&1; grep -v -i warn $OUT/profile.log | tail -14
echo "profile at $(( $(date +%s) - S )) s"
timeout 200 python3 scripts/gpu/tp_one_gpu.py --out $OUT/tp-one-gpu.json > $OUT/tp.log 2>&1; grep -E "equal|backend|build_s|start_on|rror" $OUT/tp.log | head -10
echo "call G total: $(( $(date +%s) - S )) s"
