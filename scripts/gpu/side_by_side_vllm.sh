#!/usr/bin/env bash
# The last of the back-to-back GPU calls (see side_by_side_ours.sh), carrying .vllm/bundle.part05 and .vllm/sbs.py.
# GPU call F: last vLLM part, install, the same harness on the same model folder.
cp .vllm/bundle.part05 /tmp/vstage/ && bash /tmp/vstage/install.sh > $OUT/vllm-install.log 2>&1 || { tail -20 $OUT/vllm-install.log; exit 1; }
export PYTHONPATH=/tmp/vsite VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 PYTHONUNBUFFERED=1
ls /tmp/m/qwen3-0.6b || exit 2
timeout 500 python3 .vllm/sbs.py vllm --model /tmp/m/qwen3-0.6b --out $OUT/sbs-vllm-qwen3-0.6b.json --sections throughput,tpot 2>&1 | grep -v -i "warn\|INFO" | tail -30
