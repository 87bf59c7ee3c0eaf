#!/usr/bin/env bash
# Session 41, call G (a second machine of four H200s, the first was released idle after call C; carry .whl
# .gpu/configs .gpu/tokenizers/llama3 .vllm/sbs.py): where a -tp 4 start goes. Builds Llama-3.1-8B -tp 4 on GPU 0;
# beside the build, four processes opening their CUDA contexts at once (scripts/gpu/cuda_init_parallel.py: every
# GPU visible to each, or only its own; one alone). Then `atom-run generate` starts with each ATOM_RANK_LOAD as the
# runtime had them during the call (beside = the load on a CUDA stream of its own, beside-default-stream = session
# 40's, after-join = no overlap), twice each; after the call the own-stream variant went (no gain) and `beside`
# names session 40's again (runtime/rank_load.py). (Two more starts printed rank 0's Python stacks every 0.4 s through a faulthandler
# wrapper; both crashed with SIGSEGV inside `import torch`, so the wrapper was removed and those lines with it.)
LOGS=/tmp/s41; source scripts/gpu/prelude.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c; nproc
cp .vllm/sbs.py /tmp/sbs.py
LLAMA=/tmp/m/llama-3.1-8b
mkdir -p $LLAMA && cp .gpu/tokenizers/llama3/* $LLAMA/ && cp .gpu/configs/llama-3.1-8b.json $LLAMA/config.json
export NCCL_NVLS_ENABLE=0
CUDA_VISIBLE_DEVICES=0 timeout 420 python3 -m atom_aot.build.cli --model $LLAMA --max-model-len 4096 --cache-dir /tmp/atom-cache \
  --load-format dummy -tp 4 --out /tmp/art/llama-tp4 > $LOGS/build-tp4.log 2>&1 &
sleep 2; timeout 120 python3 scripts/gpu/cuda_init_parallel.py --world 4 --out $OUT/cuda-init-parallel.json 2>&1 | tail -6
wait; at "build done"; tr '\r' '\n' < $LOGS/build-tp4.log | grep -E '^stages|rror' | tail -1 | cut -c1-300
export CUDA_VISIBLE_DEVICES=0,1,2,3
G="atom_aot.entrypoints.run_cli /tmp/art/llama-tp4 generate Hello --max-tokens 4"
for v in beside-default-stream beside after-join beside-default-stream beside after-join; do
  ATOM_RANK_LOAD=$v timeout 60 python3 -m $G > $LOGS/gen-$v.log 2>&1; at "generate $v rc=$?"
  grep -E "^startup" $LOGS/gen-$v.log | cut -c1-900; grep -E "rank [1-3]: met" $LOGS/gen-$v.log | cut -c1-300
  cat $LOGS/gen-$v.log >> $OUT/generate-tp4-$v.log
done
