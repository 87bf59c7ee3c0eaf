#!/usr/bin/env bash
# Session 41, call A (nvidia-h200-x4; carry .whl .gpu/configs .gpu/tokenizers .vllm/bundle.part05 .vllm/SHA256SUMS
# .vllm/install.sh .vllm/sbs.py): stage vLLM part 5; build Llama-3.1-8B -tp 4 (GPU 0) and Qwen3-30B-A3B at 16 of
# its 48 layers -tp 2 (GPU 1, weights drawn at load; the 48-layer compile does not fit a 10-minute call) side by
# side; then one `atom-run generate` start of the -tp 4 artifact with NCCL's init log (where the join's seconds go:
# each rank's log line, stamped to the millisecond, and NCCL's own init timings).
LOGS=/tmp/s41; source scripts/gpu/prelude.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c; nproc
mkdir -p /tmp/vstage && cp .vllm/bundle.part05 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
LLAMA=/tmp/m/llama-3.1-8b MOE=/tmp/m/qwen3-30b-a3b-16l
mkdir -p $LLAMA $MOE && cp .gpu/tokenizers/llama3/* $LLAMA/ && cp .gpu/configs/llama-3.1-8b.json $LLAMA/config.json
cp .gpu/tokenizers/qwen3/* $MOE/ && python3 -c "
import json; c = json.load(open('.gpu/configs/qwen3-30b-a3b.json')); c['num_hidden_layers'] = 16; c['max_window_layers'] = 16
json.dump(c, open('$MOE/config.json', 'w'), indent=1)"
export NCCL_NVLS_ENABLE=0
B="python3 -m atom_aot.build.cli --max-model-len 4096 --cache-dir /tmp/atom-cache"
CUDA_VISIBLE_DEVICES=0 timeout 540 $B --model $LLAMA --load-format dummy -tp 4 --out /tmp/art/llama-tp4 > $LOGS/build-tp4.log 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 540 $B --model $MOE --load-format dummy-at-load -tp 2 --out /tmp/art/moe16-tp2 > $LOGS/build-moe16.log 2>&1 &
wait; at "builds done"
for f in tp4 moe16; do echo "$f $(tr '\r' '\n' < $LOGS/build-$f.log | grep -E '^stages|rror' | tail -1)"; done | tee $OUT/build-stages.txt | cut -c1-500
G="python3 -m atom_aot.entrypoints.run_cli /tmp/art/llama-tp4 generate Hello --max-tokens 4"
CUDA_VISIBLE_DEVICES=0,1,2,3 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV timeout 90 $G > $LOGS/generate-tp4-nccl.log 2>&1
at "generate tp4 rc=$?"; cp $LOGS/generate-tp4-nccl.log $OUT/
grep -E "^startup|rank [0-9].*(joined|met|on cuda)|ranks 1\.\.|Init timings|Init COMPLETE|all-reduce over" $LOGS/generate-tp4-nccl.log | cut -c1-330 | head -40
ls /tmp/art /tmp/vstage | tr '\n' ' '
