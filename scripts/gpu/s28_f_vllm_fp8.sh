#!/usr/bin/env bash
# Session 28, H100 call F (carry .vllm/bundle.part05): install vLLM 0.24.0; vLLM FP8 (quantization fp8 from the
# bf16 folder, FP8 KV cache) through the shared harness on the folder call A made.
cp .vllm/bundle.part05 /tmp/vstage/ && bash /tmp/vstage/install.sh > $OUT/vllm-install.log 2>&1 || { tail -5 $OUT/vllm-install.log; exit 1; }
S=$(date +%s)
PYTHONPATH=/tmp/vsite VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1 timeout 420 \
  python3 /tmp/sbs.py vllm --model /tmp/m/llama-3.1-8b --out $OUT/sbs-vllm-llama-3.1-8b-fp8.json --sections throughput,tpot \
  --engine-kwargs '{"quantization": "fp8", "kv_cache_dtype": "fp8"}' > $OUT/sbs-vllm-fp8.log 2>&1
echo "vllm fp8 rc=$? at $(( $(date +%s) - S )) s"; grep -E "tok_s|tpot|init_s|Error" $OUT/sbs-vllm-fp8.log | tail -6
