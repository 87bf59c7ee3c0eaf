#!/usr/bin/env bash
# Planned for the next multi-GPU session, call A (kind nvidia-h100-x4; carry .whl .gpu/configs .gpu/tokenizers
# .vllm/bundle.part05 .vllm/SHA256SUMS .vllm/install.sh .vllm/sbs.py): stage vLLM part 5. Llama-3.1-8B -tp 4 (GPU 0)
# and -tp 2 (GPU 1) built side by side (weights drawn at build, --load-format dummy: stored, as a checkpoint's
# would be); beside them the tiny fp32 TP-2 / TP-4 == TP-1 check with each engine in a fresh process (session 36's
# ran past its time: the -tp builds now run side by side and the JSON is written after every engine).
# Then call B (s37_b_ours_tp4.sh, part00), C-E (s36_c_stage.sh, parts 01-03), F (TP=4 s36_f_vllm.sh, part04;
# then TP=2 SECTIONS=cold for vLLM's warm start beside ours).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/vstage /tmp/s36 /tmp/art && cp .vllm/bundle.part05 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c; nproc
S=$(date +%s); at() { echo "$1 at $(( $(date +%s) - S )) s"; }
LLAMA=/tmp/m/llama-3.1-8b
mkdir -p $LLAMA && cp .gpu/tokenizers/llama3/* $LLAMA/ && cp .gpu/configs/llama-3.1-8b.json $LLAMA/config.json
B="python3 -m atom_aot.build.cli --model $LLAMA --max-model-len 4096 --load-format dummy --cache-dir /tmp/atom-cache"
CUDA_VISIBLE_DEVICES=0 timeout 500 $B -tp 4 --out /tmp/art/llama-tp4 > /tmp/s36/build-tp4.log 2>&1 &
P4=$!
CUDA_VISIBLE_DEVICES=1 timeout 500 $B -tp 2 --out /tmp/art/llama-tp2 > /tmp/s36/build-tp2.log 2>&1 &
P2=$!
timeout 420 python3 scripts/gpu/tp_two_gpus.py tiny --out $OUT/tiny-tp.json > /tmp/s36/tiny.log 2>&1; at "tiny rc=$?"
python3 -c "import json; d=json.load(open('$OUT/tiny-tp.json')); print(d.get('tiny_fp32_greedy'), d.get('error'))" 2>&1 | cut -c1-900
for p in $P4 $P2; do wait $p; at "build pid $p rc=$?"; done
for f in tp4 tp2; do echo "$f $(tr '\r' '\n' < /tmp/s36/build-$f.log | grep -E '^stages|rror' | tail -1)"; done | tee $OUT/build-stages.txt | cut -c1-400
cp /tmp/s36/tiny.log $OUT/; ls /tmp/art
