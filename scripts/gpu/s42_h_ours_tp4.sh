#!/usr/bin/env bash
# Session 42, call H (no carry): Llama-3.1-8B -tp 4 on GPUs 0-3 with session 41's changes (peer memory in one
# allocation and one rendezvous; the fused kernel's one-shot rows in pairs): three fresh processes to the first
# token through the shared harness (200 s: 100 did not fit in session 41), one `atom-run generate` start with each
# rank's join itemized, the fused kernel at 4 ranks in both modes, then throughput 256 x 1024/512 and batch-1 TPOT.
LOGS=/tmp/s42; source scripts/gpu/prelude.sh
while kill -0 $(cat /tmp/build-tp4.pid) 2>/dev/null && [ $(( $(date +%s) - S )) -lt 120 ]; do sleep 3; done
tr '\r' '\n' < $LOGS/build-tp4.log | grep -E "^stages|rror" | tail -2 | tee $OUT/build-tp4-stages.txt | cut -c1-400
export NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0,1,2,3
R="python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b --artifact /tmp/art/llama-tp4"
timeout 200 $R --out $OUT/sbs-ours-tp4-cold.json --sections cold > $LOGS/cold-tp4.log 2>&1
at "tp4 cold rc=$?"; grep -E "first_token_s|rror" $LOGS/cold-tp4.log | tail -3
timeout 60 python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-tp4 generate Hello --max-tokens 4 > $LOGS/generate-tp4.log 2>&1
at "generate tp4 rc=$?"; grep -E "^startup|rank [0-9].*(joined|met|on cuda)|peer memory" $LOGS/generate-tp4.log | cut -c1-330; cp $LOGS/generate-tp4.log $OUT/
for mode in fused fused-two-shot; do
  ATOM_ALL_REDUCE_NORM=$mode timeout 80 python3 scripts/gpu/all_reduce_norm_gpus.py --world 4 --out $OUT/arn-tp4-$mode.json > $LOGS/arn-4-$mode.log 2>&1
  at "kernel tp4 $mode rc=$?"; python3 scripts/gpu/arn_summary.py $OUT/arn-tp4-$mode.json 2>&1 | tail -9 | cut -c1-250
done
timeout 150 $R --out $OUT/sbs-ours-tp4.json --sections throughput,tpot > $LOGS/sbs-tp4.log 2>&1
at "tp4 throughput+tpot rc=$?"; grep -E "output_tok_s|tpot_s\"|rror" $LOGS/sbs-tp4.log | tail -3
