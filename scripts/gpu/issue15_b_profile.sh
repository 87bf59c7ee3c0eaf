#!/usr/bin/env bash
# Issue 15, GPU call B (carry .vllm/bundle.part01): decode-step profile at batch 256, async scheduling on and off.
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 250 python3 scripts/profile_decode.py --artifact /tmp/art/qwen3.atom --out $OUT/profile-after-async.json 2>&1 | grep -v -i warn | tail -25
timeout 200 python3 scripts/profile_decode.py --artifact /tmp/art/qwen3.atom --out $OUT/profile-after-sync.json --no-async-scheduling --sections step 2>&1 | grep -v -i warn | tail -12
