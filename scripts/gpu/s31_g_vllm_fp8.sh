#!/usr/bin/env bash
# Session 31, call G (carry .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh; parts 01-05 staged by the calls
# before on this machine): install vLLM 0.24.0, then vLLM FP8 (quantization fp8 at load, FP8 KV, dummy weights) at
# 256 x 1024/512 with batch-1 TPOT, through the same sbs.py as our run of call D.
cp .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && bash /tmp/vstage/install.sh > $OUT/vllm-install.log 2>&1 || { tail -5 $OUT/vllm-install.log; exit 1; }
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
S=$(date +%s); M=/tmp/m/llama-3.1-8b
PYTHONPATH=/tmp/vsite timeout 420 python3 /tmp/sbs.py vllm --model $M --out $OUT/sbs-vllm-llama-fp8.json \
  --sections throughput,tpot --engine-kwargs '{"quantization": "fp8", "kv_cache_dtype": "fp8", "load_format": "dummy"}' > $OUT/sbs-vllm-fp8.log 2>&1
echo "vllm fp8 rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|tpot_s\"|init_s|rror" $OUT/sbs-vllm-fp8.log | tail -4
