#!/usr/bin/env bash
# Session 34, nvidia-h100-x2 call F (carry .vllm/bundle.part05 .vllm/sbs.py): install vLLM 0.24.0; vLLM at
# tensor_parallel_size 2 on the same Llama-3.1-8B config folder with its own random weights (load_format dummy):
# throughput 256 x 1024/512 and batch-1 TPOT, then (SECTIONS=cold) its cold starts.
cp .vllm/bundle.part05 /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
[ -d /tmp/vsite/vllm ] || bash /tmp/vstage/install.sh > $OUT/vllm-install.log 2>&1 || { tail -5 $OUT/vllm-install.log; exit 1; }
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
pkill -9 -f "runtime[.]cli"; nvidia-smi --query-gpu=memory.used --format=csv,noheader; S=$(date +%s)
PYTHONPATH=/tmp/vsite timeout 400 python3 /tmp/sbs.py vllm --model /tmp/m/llama-3.1-8b --out $OUT/sbs-vllm-llama-tp2-${SECTIONS:-tp}.json \
  --sections ${SECTIONS:-throughput,tpot} --engine-kwargs '{"load_format": "dummy", "tensor_parallel_size": 2}' > $OUT/sbs-vllm.log 2>&1
echo "vllm rc=$? at $(( $(date +%s) - S )) s"; grep -E "first_token_s|output_tok_s|tpot_s\"|init_s|rror" $OUT/sbs-vllm.log | tail -8
