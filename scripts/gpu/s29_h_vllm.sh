#!/usr/bin/env bash
# Session 29, call H (carry .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh): install vLLM 0.24.0; once our MoE build is done (it holds the
# GPU), vLLM FP8 (quantization fp8 from the bf16 folder, FP8 KV cache) on Llama-3.1-8B, then vLLM on the
# 24-layer Qwen3-30B-A3B config with its own random weights (load_format dummy), through the shared harness.
cp .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && bash /tmp/vstage/install.sh > $OUT/vllm-install.log 2>&1 || { tail -5 $OUT/vllm-install.log; exit 1; }
S=$(date +%s)
while kill -0 $(cat /tmp/build-moe.pid) 2>/dev/null && [ $(( $(date +%s) - S )) -lt 200 ]; do sleep 3; done
echo "moe build done/waited at $(( $(date +%s) - S )) s: running=$(kill -0 $(cat /tmp/build-moe.pid) 2>/dev/null && echo yes || echo no)"
grep -v "it/s\]" /tmp/build-moe.log | tail -3; cp /tmp/build-moe.log $OUT/
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
PYTHONPATH=/tmp/vsite timeout 240 python3 /tmp/sbs.py vllm --model /tmp/m/llama-3.1-8b --out $OUT/sbs-vllm-llama-3.1-8b-fp8.json \
  --sections throughput,tpot --engine-kwargs '{"quantization": "fp8", "kv_cache_dtype": "fp8"}' > $OUT/sbs-vllm-fp8.log 2>&1
echo "vllm fp8 rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|tpot_s\"|init_s" $OUT/sbs-vllm-fp8.log | tail -3
kill -0 $(cat /tmp/build-moe.pid) 2>/dev/null && { echo "moe build still running: vLLM MoE left for the next call"; exit 0; }
PYTHONPATH=/tmp/vsite timeout $(( 560 - ($(date +%s) - S) )) python3 /tmp/sbs.py vllm --model /tmp/m/qwen3-30b-a3b-24l --out $OUT/sbs-vllm-qwen3-moe-24l.json \
  --sections throughput,tpot --engine-kwargs '{"load_format": "dummy"}' > $OUT/sbs-vllm-moe.log 2>&1
echo "vllm moe rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|tpot_s\"|init_s|rror" $OUT/sbs-vllm-moe.log | tail -4
