#!/usr/bin/env bash
# Session 42, call A (nvidia-h200-x4; carry .whl .gpu/configs .gpu/tokenizers .vllm/bundle.part05 .vllm/SHA256SUMS
# .vllm/install.sh .vllm/sbs.py): stage vLLM part 5; start both builds detached (setsid: they outlive the call, so
# the next calls stage vLLM while they compile) from a copy of the tree: Llama-3.1-8B -tp 4 on GPU 0 and
# Qwen3-30B-A3B at 16 of its 48 layers -tp 2 on GPU 1, now with its weights written into the artifact
# (--load-format dummy, as a checkpoint's would be: session 36's and 41's drew them at load, 6-7 s of each start);
# then session 41's MoE glue kernels (sort, combine, routers) against torch on GPU 2 (tests/test_triton_moe.py).
LOGS=/tmp/s42; source scripts/gpu/prelude.sh
source scripts/gpu/detached_builds.sh     # model folders, vLLM part 5 staged, `build GPU NAME ARGS...`
build 0 tp4 --model $LLAMA --load-format dummy -tp 4 --out /tmp/art/llama-tp4
build 1 moe16 --model $MOE --load-format dummy -tp 2 --out /tmp/art/moe16-tp2
at "builds started: $(cat /tmp/build-tp4.pid) $(cat /tmp/build-moe16.pid)"
CUDA_VISIBLE_DEVICES=2 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_triton_moe.py > $LOGS/moe-tests.log 2>&1
at "moe kernel tests rc=$?"; tail -3 $LOGS/moe-tests.log; cp $LOGS/moe-tests.log $OUT/
for f in tp4 moe16; do echo "$f: $(tr '\r' '\n' < $LOGS/build-$f.log | grep -v '^\s*$' | tail -1 | cut -c1-200)"; done
uptime
