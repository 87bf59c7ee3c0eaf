#!/usr/bin/env bash
# Session 28, H200 call A (carry .whl .gpu/configs .gpu/tokenizers/qwen3 .vllm/bundle.part00 .vllm/SHA256SUMS
# .vllm/install.sh .vllm/sbs.py): Qwen3-30B-A3B (61 GB bf16) built from its config with random weights
# (--load-format dummy: one copy on disk, the artifact folder), detached so it may outlive this call (call B
# waits for it); the MoE kernel benchmark runs on the GPU once the build's tuning is over (its compile is CPU work).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/vstage && cp .vllm/bundle.part00 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
{ nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv; df -h /tmp /dev/shm; free -g; nproc; } > $OUT/machine.txt 2>&1
M=/tmp/m/qwen3-30b-a3b
mkdir -p $M /tmp/btmp /tmp/art && cp .gpu/configs/qwen3-30b-a3b.json $M/config.json && cp .gpu/tokenizers/qwen3/* $M/
rm -rf /tmp/src && cp -r $PWD /tmp/src
S=$(date +%s)
(cd /tmp/src && TMPDIR=/tmp/btmp PYTHONPATH=/tmp/site:/tmp/src PYTHONUNBUFFERED=1 setsid nohup python3 -m atom_aot.build.cli \
   --model $M --load-format dummy --max-model-len 4096 --out /tmp/art/qwen3-30b-a3b > /tmp/build-moe.log 2>&1 < /dev/null & echo $! > /tmp/build-moe.pid)
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
for i in $(seq 1 400); do grep -q "export (" /tmp/build-moe.log 2>/dev/null && break; kill -0 $(cat /tmp/build-moe.pid) 2>/dev/null || break; sleep 1; done
echo "tuning over at $(( $(date +%s) - S )) s"; free -g | head -2
timeout 200 python3 scripts/bench_moe.py --configs .gpu/configs --out $OUT/moe-kernels-h200.json > $OUT/bench-moe.log 2>&1; echo "bench_moe rc=$? at $(( $(date +%s) - S )) s"
while kill -0 $(cat /tmp/build-moe.pid) 2>/dev/null && [ $(( $(date +%s) - S )) -lt 540 ]; do sleep 5; done
echo "call A ends at $(( $(date +%s) - S )) s; build running: $(kill -0 $(cat /tmp/build-moe.pid) 2>/dev/null && echo yes || echo no)"
grep -v "it/s\]" /tmp/build-moe.log | tail -4; free -g | head -2; df -h /tmp | tail -1
cp /tmp/build-moe.log $OUT/
