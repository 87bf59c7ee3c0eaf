#!/usr/bin/env bash
# Session 39, call A (kind nvidia-h200-x4; carry .whl .gpu/configs .gpu/tokenizers .vllm/bundle.part05
# .vllm/SHA256SUMS .vllm/install.sh .vllm/sbs.py): stage vLLM part 5; build Llama-3.1-8B -tp 2 (GPU 2) and -tp 4
# (GPU 3) side by side with the fused all-reduce + RMSNorm (weights drawn at build, --load-format dummy); beside
# them, on GPUs 0,1, the fused kernel's checks and timings over 2 ranks (scripts/gpu/all_reduce_norm_gpus.py).
LOGS=/tmp/s39; source scripts/gpu/prelude.sh
mkdir -p /tmp/vstage && cp .vllm/bundle.part05 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c; nproc
LLAMA=/tmp/m/llama-3.1-8b
mkdir -p $LLAMA && cp .gpu/tokenizers/llama3/* $LLAMA/ && cp .gpu/configs/llama-3.1-8b.json $LLAMA/config.json
B="python3 -m atom_aot.build.cli --model $LLAMA --max-model-len 4096 --load-format dummy --cache-dir /tmp/atom-cache"
CUDA_VISIBLE_DEVICES=2 timeout 540 $B -tp 2 --out /tmp/art/llama-tp2 > $LOGS/build-tp2.log 2>&1 &
P2=$!
CUDA_VISIBLE_DEVICES=3 timeout 540 $B -tp 4 --out /tmp/art/llama-tp4 > $LOGS/build-tp4.log 2>&1 &
P4=$!
CUDA_VISIBLE_DEVICES=0,1 NCCL_NVLS_ENABLE=0 timeout 240 python3 scripts/gpu/all_reduce_norm_gpus.py --world 2 --out $OUT/arn-tp2.json > $LOGS/arn-tp2.log 2>&1
at "kernel checks (2 ranks) rc=$?"; grep -E "Error|error|Traceback" $LOGS/arn-tp2.log | tail -4
python3 scripts/gpu/arn_summary.py $OUT/arn-tp2.json
for p in $P2 $P4; do wait $p; at "build pid $p rc=$?"; done
for f in tp2 tp4; do echo "$f $(tr '\r' '\n' < $LOGS/build-$f.log | grep -E '^stages|rror' | tail -1)"; done | tee $OUT/build-stages.txt | cut -c1-500
grep -h -E "Encountered an exception|assuming every input is mutated" $LOGS/build-*.log | sort | uniq -c | head -3
ls /tmp/art; cp $LOGS/arn-tp2.log $OUT/ 2>/dev/null
