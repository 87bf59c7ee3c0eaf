#!/usr/bin/env bash
# Planned for the next multi-GPU session, beside s41_a_builds.sh (whose builds hold GPUs 0 and 1):
#   bash scripts/gpu/s42_next_checks.sh > /tmp/checks.log 2>&1 & bash scripts/gpu/s41_a_builds.sh; wait; cat /tmp/checks.log
# Session 41's changes that ran only on CPUs, checked on GPUs before anything is timed: the MoE op's glue kernels
# (sort by expert, combine, router) against torch on GPU 3 (tests/test_triton_moe.py; without TRITON_INTERPRET
# it runs on the GPU), then the fused all-reduce + norm over 2 ranks (GPUs 2,3) on the peer memory now mapped as one
# allocation: its checks, and rank 0's join in parts (the JSON's join_s: the mapping's seconds).
LOGS=/tmp/s42; source scripts/gpu/prelude.sh
export NCCL_NVLS_ENABLE=0
CUDA_VISIBLE_DEVICES=3 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_triton_moe.py > $LOGS/moe-tests.log 2>&1
at "moe kernel tests rc=$?"; tail -3 $LOGS/moe-tests.log
CUDA_VISIBLE_DEVICES=2,3 timeout 150 python3 scripts/gpu/all_reduce_norm_gpus.py --world 2 --out $OUT/arn-tp2-one-allocation.json > $LOGS/arn2.log 2>&1
at "fused kernel tp2 rc=$?"; python3 scripts/gpu/arn_summary.py $OUT/arn-tp2-one-allocation.json 2>&1 | grep -E "BITS|replays|timing" | tail -4 | cut -c1-250
python3 -c "import json; print(json.load(open('$OUT/arn-tp2-one-allocation.json')).get('join_s'))"
