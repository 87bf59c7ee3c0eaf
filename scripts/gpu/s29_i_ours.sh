#!/usr/bin/env bash
# Session 29, call I: our side: the MoE artifact (inspect, sbs) and, if call C had no time for it, the FP8 one;
# the FP8 decode-step profile at batch 256 last.
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s)
python3 -m atom_aot.entrypoints.run_cli /tmp/art/qwen3-moe-24l inspect > $OUT/inspect-moe.txt 2>&1; grep -E "phase|moe|weights" $OUT/inspect-moe.txt | head -8
timeout 240 python3 /tmp/sbs.py ours --model /tmp/m/qwen3-30b-a3b-24l --artifact /tmp/art/qwen3-moe-24l --out $OUT/sbs-ours-qwen3-moe-24l.json --sections throughput,tpot > $OUT/sbs-ours-moe.log 2>&1
echo "ours moe rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|tpot_s\"|init_s|rror" $OUT/sbs-ours-moe.log | tail -4
if [ ! -f /tmp/ours-fp8-done ]; then
  timeout 150 python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama-fp8.atom --out $OUT/sbs-ours-llama-3.1-8b-fp8.json --sections throughput,tpot > $OUT/sbs-ours-fp8.log 2>&1
  echo "ours fp8 rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|tpot_s\"|init_s" $OUT/sbs-ours-fp8.log | tail -3
fi
[ $(( $(date +%s) - S )) -lt 420 ] && timeout 150 python3 scripts/profile_decode.py --artifact /tmp/art/llama-fp8.atom --out $OUT/profile-llama-fp8-b256.json --sections step,kernels > $OUT/profile.log 2>&1
echo "call I total $(( $(date +%s) - S )) s"
