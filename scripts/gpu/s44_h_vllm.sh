#!/usr/bin/env bash
# Session 44, call H: vLLM 0.24.0 on the same config + tokenizer folder through the shared harness (s40_f_vllm.sh:
# SECTIONS, default throughput,tpot), and what its log says of its memory: the KV cache it sized, its activation
# profile, preemptions.
TP=1 MODEL=${MODEL:-llama-3.1-8b} SECTIONS=${SECTIONS:-throughput,tpot} LIMIT=${LIMIT:-560} bash scripts/gpu/s40_f_vllm.sh
grep -iE "KV cache size|maximum concurrency|available kv|activation|memory profil|weights take|preempt|non.torch" \
  /tmp/s40/sbs-vllm-tp1.log | cut -c1-300 | head -20 | tee $OUT/vllm-memory-lines.txt
