#!/usr/bin/env bash
# Session 30, call F (carry .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh): install vLLM 0.24.0; vLLM on the
# same config folder with its own random weights (load_format dummy): FP8 (quantization fp8 at load, FP8 KV) at
# 1000 x 1000/1000, then bf16 at 256 x 1024/512 with batch-1 TPOT.
cp .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && bash /tmp/vstage/install.sh > $OUT/vllm-install.log 2>&1 || { tail -5 $OUT/vllm-install.log; exit 1; }
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
S=$(date +%s); M=/tmp/m/llama-3.1-8b
PYTHONPATH=/tmp/vsite timeout 330 python3 /tmp/sbs.py vllm --model $M --out $OUT/sbs-vllm-llama-fp8-1000x1000.json \
  --sections throughput --num-prompts 1000 --input-len 1000 --output-len 1000 \
  --engine-kwargs '{"quantization": "fp8", "kv_cache_dtype": "fp8", "load_format": "dummy"}' > $OUT/sbs-vllm-fp8-1000.log 2>&1
echo "vllm fp8 1000x1000 rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|init_s|rror" $OUT/sbs-vllm-fp8-1000.log | tail -3
PYTHONPATH=/tmp/vsite timeout $(( 560 - ($(date +%s) - S) )) python3 /tmp/sbs.py vllm --model $M --out $OUT/sbs-vllm-llama-bf16.json \
  --sections throughput,tpot --engine-kwargs '{"load_format": "dummy"}' > $OUT/sbs-vllm-bf16.log 2>&1
echo "vllm bf16 rc=$? at $(( $(date +%s) - S )) s"; grep -E "output_tok_s|tpot_s\"|init_s|rror" $OUT/sbs-vllm-bf16.log | tail -4
