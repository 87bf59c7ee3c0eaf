#!/usr/bin/env bash
# Session 42, call G (no carry): our Qwen3-30B-A3B (16 layers) -tp 2 on GPUs 2,3 (the GPUs vLLM's run of call F
# used), once call A's detached build is done: three fresh-process starts, throughput 256 x 1024/512, batch-1 TPOT
# through the shared harness, with session 41's MoE glue kernels and the MoE blocks' all-reduce in the fused norm;
# an `atom-run generate` start breakdown; then where its batch-256 decode step goes (rank 0's kernels by category).
LOGS=/tmp/s42; source scripts/gpu/prelude.sh
while kill -0 $(cat /tmp/build-moe16.pid) 2>/dev/null && [ $(( $(date +%s) - S )) -lt 150 ]; do sleep 3; done
at "moe16 build waited"; tr '\r' '\n' < $LOGS/build-moe16.log | grep -E "^stages|rror" | tail -2 | cut -c1-400
tr '\r' '\n' < $LOGS/build-moe16.log | grep -E "^stages" > $OUT/build-moe16-stages.txt; du -sh /tmp/art/moe16-tp2
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=2,3
M=/tmp/m/qwen3-30b-a3b-16l ART=/tmp/art/moe16-tp2
timeout 240 python3 /tmp/sbs.py ours --model $M --artifact $ART --out $OUT/sbs-ours-moe16-tp2.json \
  --sections cold,throughput,tpot > $LOGS/sbs-moe16.log 2>&1
at "moe16 tp2 rc=$?"; grep -E "first_token_s|output_tok_s|tpot_s\"|init_s|rror" $LOGS/sbs-moe16.log | tail -8
grep -E "all-reduce over|fused|moe" $LOGS/sbs-moe16.log | sort | uniq -c | head -4 | cut -c1-300
timeout 60 python3 -m atom_aot.entrypoints.run_cli $ART generate Hello --max-tokens 4 > $LOGS/generate-moe16.log 2>&1
at "generate moe16 rc=$?"; grep -E "^startup|rank [0-9].*(joined|met)" $LOGS/generate-moe16.log | cut -c1-400; cp $LOGS/generate-moe16.log $OUT/
timeout 90 python3 scripts/profile_decode.py --artifact $ART --batch 256 --input-len 1024 \
  --sections step,kernels --out $OUT/profile-moe16-tp2-b256.json > $LOGS/profile-moe16.log 2>&1
at "profile rc=$?"; python3 -c "
import json; d = json.load(open('$OUT/profile-moe16-tp2-b256.json')); k = d.get('kernels', {})
print(k.get('category_ms_per_step'), k.get('gpu_kernel_ms_per_step')); print([(t['name'][:60], round(t['ms_per_step'], 3), t['calls_per_step']) for t in k.get('top_kernels', [])[:14]]); print(d.get('step'))" 2>&1 | cut -c1-3000
tail -2 $LOGS/profile-moe16.log | cut -c1-300
