#!/usr/bin/env bash
# Session 39, call B (carry .vllm/bundle.part00): stage vLLM part 0. The fused kernel over 4 ranks (checks, timings);
# through the shared harness our Llama-3.1-8B -tp 2 (GPUs 0,1: cold x3, throughput 256 x 1024/512, batch-1 TPOT),
# its TPOT again with ATOM_ALL_REDUCE_NORM=separate (the A/B), and -tp 4 (GPUs 0-3: throughput, TPOT, cold x3).
LOGS=/tmp/s39; source scripts/gpu/prelude.sh
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export NCCL_NVLS_ENABLE=0
timeout 150 python3 scripts/gpu/all_reduce_norm_gpus.py --world 4 --out $OUT/arn-tp4.json > $LOGS/arn-tp4.log 2>&1
at "kernel checks (4 ranks) rc=$?"; grep -E "Error|Traceback" $LOGS/arn-tp4.log | tail -3; python3 scripts/gpu/arn_summary.py $OUT/arn-tp4.json
R="python3 /tmp/sbs.py ours --model /tmp/m/llama-3.1-8b"
K='grep -E "first_token_s|output_tok_s|tpot_s\"|init_s|rror"'
CUDA_VISIBLE_DEVICES=0,1 timeout 240 $R --artifact /tmp/art/llama-tp2 --out $OUT/sbs-ours-llama-tp2.json --sections throughput,tpot,cold > $LOGS/sbs-tp2.log 2>&1
at "ours tp2 rc=$?"; eval "$K $LOGS/sbs-tp2.log" | tail -8; grep -E "all-reduce" $LOGS/sbs-tp2.log | sort | uniq -c | head -3 | cut -c1-300
CUDA_VISIBLE_DEVICES=0,1 ATOM_ALL_REDUCE_NORM=separate timeout 100 $R --artifact /tmp/art/llama-tp2 --out $OUT/sbs-ours-llama-tp2-separate.json --sections tpot > $LOGS/sbs-tp2-sep.log 2>&1
at "ours tp2 separate rc=$?"; eval "$K $LOGS/sbs-tp2-sep.log" | tail -3; grep -E "all-reduce" $LOGS/sbs-tp2-sep.log | sort | uniq -c | head -2 | cut -c1-300
CUDA_VISIBLE_DEVICES=0,1,2,3 timeout $(( 590 - ($(date +%s) - S) )) $R --artifact /tmp/art/llama-tp4 --out $OUT/sbs-ours-llama-tp4.json --sections throughput,tpot,cold > $LOGS/sbs-tp4.log 2>&1
at "ours tp4 rc=$?"; eval "$K $LOGS/sbs-tp4.log" | tail -8; grep -E "all-reduce" $LOGS/sbs-tp4.log | sort | uniq -c | head -2 | cut -c1-300
tail -c 15000 $LOGS/sbs-tp2.log > $OUT/sbs-tp2.log.tail; cp $LOGS/arn-tp4.log $OUT/ 2>/dev/null
