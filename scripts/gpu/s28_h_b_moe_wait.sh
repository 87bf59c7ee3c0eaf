#!/usr/bin/env bash
# Session 28, H200 call B: wait for the detached build; then our artifact through the shared harness.
S=$(date +%s)
while kill -0 $(cat /tmp/build-moe.pid) 2>/dev/null && [ $(( $(date +%s) - S )) -lt 420 ]; do sleep 5; done
echo "build running after $(( $(date +%s) - S )) s: $(kill -0 $(cat /tmp/build-moe.pid) 2>/dev/null && echo yes || echo no)"
grep -v "it/s\]" /tmp/build-moe.log | grep -E "stages|sizes|rror|Killed" | tail -6; cp /tmp/build-moe.log $OUT/
ls /tmp/art/qwen3-30b-a3b >/dev/null 2>&1 || exit 3
export PYTHONPATH=/tmp/site:$PWD:/tmp/vsite PYTHONUNBUFFERED=1
python3 -m atom_aot.entrypoints.run_cli /tmp/art/qwen3-30b-a3b inspect > $OUT/inspect-moe.txt 2>&1; grep -E "phase|model|fused" $OUT/inspect-moe.txt
timeout $(( 560 - $(date +%s) + S )) python3 /tmp/sbs.py ours --model /tmp/m/qwen3-30b-a3b --artifact /tmp/art/qwen3-30b-a3b --out $OUT/sbs-ours-qwen3-30b-a3b.json --sections throughput,tpot > $OUT/sbs-ours.log 2>&1
echo "ours rc=$? at $(( $(date +%s) - S )) s"; grep -E "tok_s|tpot_s|init_s|rror" $OUT/sbs-ours.log | tail -5
