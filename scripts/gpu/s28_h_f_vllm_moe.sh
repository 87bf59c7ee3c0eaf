#!/usr/bin/env bash
# Session 28, H200 call F (carry .vllm/bundle.part05): install vLLM; vLLM on the same config with its own random
# weights (load_format dummy) through the shared harness.
cp .vllm/bundle.part05 /tmp/vstage/ && bash /tmp/vstage/install.sh > $OUT/vllm-install.log 2>&1 || { tail -5 $OUT/vllm-install.log; exit 1; }
S=$(date +%s)
PYTHONPATH=/tmp/vsite VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1 timeout 540 \
  python3 /tmp/sbs.py vllm --model /tmp/m/qwen3-30b-a3b --out $OUT/sbs-vllm-qwen3-30b-a3b.json --sections throughput,tpot \
  --engine-kwargs '{"load_format": "dummy"}' > $OUT/sbs-vllm.log 2>&1
echo "vllm rc=$? at $(( $(date +%s) - S )) s"; grep -E "tok_s|tpot_s|init_s|rror" $OUT/sbs-vllm.log | tail -6
