#!/usr/bin/env bash
# Session 40, call A (nvidia-h200-x4; carry .whl .gpu/configs .gpu/tokenizers/llama3 .vllm/bundle.part05
# .vllm/SHA256SUMS .vllm/install.sh .vllm/sbs.py .old): stage vLLM part 5 and the runtime as it was before this
# session (.old: `git archive c59dffb atom_aot`, for the start A/B); build Llama-3.1-8B -tp 2 (GPU 0), -tp 4 (GPU 1)
# and -tp 1 with the same weights drawn at load (GPU 2, the logits reference) side by side; beside them the tiny
# fp32 TP 2 / TP 4 == TP 1 greedy check on the fused all-reduce + norm (engines one after another in one process).
LOGS=/tmp/s40; source scripts/gpu/prelude.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c; nproc
mkdir -p /tmp/vstage && cp .vllm/bundle.part05 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
rm -rf /tmp/old && cp -r .old /tmp/old
LLAMA=/tmp/m/llama-3.1-8b
mkdir -p $LLAMA && cp .gpu/tokenizers/llama3/* $LLAMA/ && cp .gpu/configs/llama-3.1-8b.json $LLAMA/config.json
export NCCL_NVLS_ENABLE=0
B="python3 -m atom_aot.build.cli --model $LLAMA --max-model-len 4096 --cache-dir /tmp/atom-cache"
CUDA_VISIBLE_DEVICES=0 timeout 480 $B --load-format dummy -tp 2 --out /tmp/art/llama-tp2 > $LOGS/build-tp2.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 480 $B --load-format dummy -tp 4 --out /tmp/art/llama-tp4 > $LOGS/build-tp4.log 2>&1 &
CUDA_VISIBLE_DEVICES=2 timeout 480 $B --load-format dummy-at-load --out /tmp/art/llama-tp1 > $LOGS/build-tp1.log 2>&1 &
timeout 200 python3 scripts/gpu/tp_two_gpus.py tiny --tiny-models 1 --same-process --out $OUT/tiny-tp-same-process.json > $LOGS/tiny.log 2>&1
at "tiny rc=$?"; python3 -c "import json; d=json.load(open('$OUT/tiny-tp-same-process.json')); print(d.get('tiny_fp32_greedy'), d.get('error'))" 2>&1 | cut -c1-900
grep -hE "all-reduce|fused" $LOGS/tiny.log | sort | uniq -c | head -4 | cut -c1-300
wait; at "builds done"
for f in tp2 tp4 tp1; do echo "$f $(tr '\r' '\n' < $LOGS/build-$f.log | grep -E '^stages|rror' | tail -1)"; done | tee $OUT/build-stages.txt | cut -c1-400
cp $LOGS/tiny.log $OUT/; ls /tmp/art /tmp/vstage | tr '\n' ' '
