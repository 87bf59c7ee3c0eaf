#!/usr/bin/env bash
# Issue 15, GPU call F (carry .vllm/bundle.part05 .vllm/sbs.py): install vLLM 0.24 and run the same harness on the same folder.
cp .vllm/bundle.part05 /tmp/vstage/ && bash /tmp/vstage/install.sh > $OUT/vllm-install.log 2>&1 || { tail -20 $OUT/vllm-install.log; exit 1; }
export PYTHONPATH=/tmp/vsite VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
timeout 520 python3 .vllm/sbs.py vllm --model /tmp/m/qwen3-0.6b --out $OUT/sbs-vllm-qwen3-0.6b.json --sections throughput,tpot 2>&1 | grep -v -i "warn\|INFO" | tail -25
