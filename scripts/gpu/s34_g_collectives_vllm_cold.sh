#!/usr/bin/env bash
# Session 34, nvidia-h100-x2 call G (carry .vllm/sbs.py): the NCCL all-reduce table without symmetric memory (it hung
# in call A), then vLLM's cold starts at tensor_parallel_size 2 (cold and warm compile cache, enforce_eager).
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s)
timeout 60 python3 scripts/gpu/tp_two_gpus.py collectives --out $OUT/h100x2-collectives.json > $OUT/collectives.log 2>&1
echo "collectives rc=$? at $(( $(date +%s) - S )) s"
python3 -c "import json; d=json.load(open('$OUT/h100x2-collectives.json')); print(json.dumps(d.get('collectives', d))[:2500])"
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
PYTHONPATH=/tmp/vsite timeout 370 python3 /tmp/sbs.py vllm --model /tmp/m/llama-3.1-8b --out $OUT/sbs-vllm-llama-tp2-cold.json \
  --sections cold --engine-kwargs '{"load_format": "dummy", "tensor_parallel_size": 2}' > $OUT/sbs-vllm-cold.log 2>&1
echo "vllm cold rc=$? at $(( $(date +%s) - S )) s"; grep -E "first_token_s|rror" $OUT/sbs-vllm-cold.log | tail -8
