#!/usr/bin/env bash
# Session 42, calls J1-J6 (a fresh machine after the first was given back): vLLM's 16-layer Qwen3-30B-A3B at TP 2
# again, this time with nothing beside it (call F ran it while our MoE build compiled on GPU 1). FIRST=1 (J1, carry
# .gpu/configs .gpu/tokenizers/qwen3 .vllm/bundle.part05 .vllm/SHA256SUMS .vllm/install.sh .vllm/sbs.py) makes the
# model folder; J2-J5 carry parts 0-3; J6 carries part 4 and runs `TP=2 MODEL=qwen3-30b-a3b-16l s40_f_vllm.sh`.
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ 2>/dev/null
if [ "${FIRST:-0}" = 1 ]; then
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sort | uniq -c; nproc
  M=/tmp/m/qwen3-30b-a3b-16l; mkdir -p $M && cp .gpu/tokenizers/qwen3/* $M/ && cp .vllm/sbs.py /tmp/sbs.py && python3 -c "
import json; c = json.load(open('.gpu/configs/qwen3-30b-a3b.json')); c['num_hidden_layers'] = 16; c['max_window_layers'] = 16
json.dump(c, open('$M/config.json', 'w'), indent=1)"
fi
ls /tmp/vstage | tr '\n' ' '; uptime
