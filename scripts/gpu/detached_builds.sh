#!/usr/bin/env bash
# Sourced by a multi-GPU session's first call (from session 42 on), after prelude.sh: prints the machine, stages
# vLLM's last bundle part and the harness, makes the model folders (Llama-3.1-8B; Qwen3-30B-A3B at 16 of its 48
# layers) from the carried configs and tokenizers, copies the tree to /tmp/src, and defines `build GPU NAME ARGS...`:
# one atom-build started detached (setsid, so it outlives the call while the next calls stage vLLM), its log in
# $LOGS/build-NAME.log and its pid in /tmp/build-NAME.pid (s42_b_stage.sh prints their progress).
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c; nproc; df -h /tmp | tail -1
mkdir -p /tmp/vstage && cp .vllm/bundle.part05 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
LLAMA=/tmp/m/llama-3.1-8b MOE=/tmp/m/qwen3-30b-a3b-16l
mkdir -p $LLAMA $MOE && cp .gpu/tokenizers/llama3/* $LLAMA/ && cp .gpu/configs/llama-3.1-8b.json $LLAMA/config.json
cp .gpu/tokenizers/qwen3/* $MOE/ && python3 -c "
import json; c = json.load(open('.gpu/configs/qwen3-30b-a3b.json')); c['num_hidden_layers'] = 16; c['max_window_layers'] = 16
json.dump(c, open('$MOE/config.json', 'w'), indent=1)"
rm -rf /tmp/src && mkdir /tmp/src && cp -r $(ls -A | grep -vxE "\.vllm|\.git") /tmp/src/
export NCCL_NVLS_ENABLE=0
build() {  # GPU NAME ARGS...: one detached build from /tmp/src, its pid in /tmp/build-NAME.pid
  local gpu=$1 name=$2; shift 2
  (cd /tmp/src && CUDA_VISIBLE_DEVICES=$gpu PYTHONPATH=/tmp/site:/tmp/src setsid nohup timeout 1000 python3 -m atom_aot.build.cli \
     --max-model-len 4096 --cache-dir /tmp/atom-cache "$@" > $LOGS/build-$name.log 2>&1 < /dev/null & echo $! > /tmp/build-$name.pid)
}
