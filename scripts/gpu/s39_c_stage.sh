#!/usr/bin/env bash
# Session 39, calls C-E (carry one of .vllm/bundle.part01, 02, 03 in turn): stage one vLLM part; on the first, a
# start's breakdown of each artifact (`atom-run generate`: ranks start + join, weights, graphs; runtime compilations).
LOGS=/tmp/s39; source scripts/gpu/prelude.sh
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/ && ls /tmp/vstage | tr '\n' ' '; echo
if [ ! -f $LOGS/generate-tp2.log ]; then
  for tp in 2 4; do
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(( tp - 1 ))) NCCL_NVLS_ENABLE=0 timeout 60 python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-tp$tp generate "Hello" --max-tokens 4 > $LOGS/generate-tp$tp.log 2>&1
    at "generate tp$tp rc=$?"; grep -E "tensor-parallel ranks|all-reduce|^startup|runtime compilations" $LOGS/generate-tp$tp.log | cut -c1-400
  done
  cp $LOGS/generate-tp*.log $OUT/
fi
if [ "$ARN4" = 1 ]; then     # the 4-rank kernel again with slabs of at least 16 KiB (call B's 4 KiB took no row)
  NCCL_NVLS_ENABLE=0 timeout 100 python3 scripts/gpu/all_reduce_norm_gpus.py --world 4 --out $OUT/arn-tp4-slab16k.json > $LOGS/arn-tp4b.log 2>&1
  at "kernel checks (4 ranks, 16 KiB slabs) rc=$?"; grep -E "Error|Traceback" $LOGS/arn-tp4b.log | tail -3; python3 scripts/gpu/arn_summary.py $OUT/arn-tp4-slab16k.json
fi
