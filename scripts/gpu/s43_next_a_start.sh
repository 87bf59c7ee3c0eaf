#!/usr/bin/env bash
# Planned for the next session on nvidia-h200-x4 (call A; carry .whl .gpu/configs .gpu/tokenizers .vllm/bundle.part05
# .vllm/SHA256SUMS .vllm/install.sh .vllm/sbs.py), then `LOGS=/tmp/s43 bash scripts/gpu/s42_b_stage.sh` with parts
# 0-3 (calls B-E), then s43_next_f_ours_tp4.sh (part 4, installs vLLM), TP=4 s40_f_vllm.sh, s43_next_h_ours_moe_tp4.sh,
# TP=4 MODEL=qwen3-30b-a3b-16l s40_f_vllm.sh (docs/gpu.md, Next). Stages vLLM part 5 and starts three builds detached
# (setsid) from a copy of the tree: Llama-3.1-8B -tp 4 (GPU 0), the 16-layer Qwen3-30B-A3B -tp 4 (GPU 1) and
# -tp 4 --ep (GPU 2), weights written into the artifacts (each with the `sample` package since session 42); then the
# sampler's threshold kernel on GPU 3.
LOGS=/tmp/s43; source scripts/gpu/prelude.sh
source scripts/gpu/detached_builds.sh     # model folders, vLLM part 5 staged, `build GPU NAME ARGS...`
build 0 tp4 --model $LLAMA --load-format dummy -tp 4 --out /tmp/art/llama-tp4
build 1 moe16-tp4 --model $MOE --load-format dummy -tp 4 --out /tmp/art/moe16-tp4
build 2 moe16-ep4 --model $MOE --load-format dummy -tp 4 --ep --out /tmp/art/moe16-ep4
# session 42's sampler thresholds on GPU 3 while they compile: the `sample` package as the builds make it (export,
# compile, open, against the sort), the kernel's tests without the interpreter, and its time against the sort
CUDA_VISIBLE_DEVICES=3 timeout 150 python3 scripts/gpu/sample_package_check.py --out $OUT/sample-package.json > $LOGS/sample-package.log 2>&1
at "sample package rc=$?"; tail -2 $LOGS/sample-package.log | cut -c1-600
CUDA_VISIBLE_DEVICES=3 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_sampling_threshold.py > $LOGS/sampling-tests.log 2>&1
at "sampling tests rc=$?"; tail -2 $LOGS/sampling-tests.log
CUDA_VISIBLE_DEVICES=3 timeout 120 python3 scripts/gpu/sampling_bench.py --out $OUT/sampling-bench.json > $LOGS/sampling-bench.log 2>&1
at "sampling bench rc=$?"; cut -c1-400 $LOGS/sampling-bench.log | tail -12
for f in /tmp/build-*.pid; do echo "$f $(cat $f)"; done; uptime
