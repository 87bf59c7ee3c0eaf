#!/usr/bin/env bash
# Session 43, call F (carry .vllm/bundle.part04 and A's carry): vLLM 0.24.0 installed (/tmp/vsite) while call A's
# build compiles; once its tuning is done (the GPU then idle but for the build's resident weights), the threshold
# kernel's tests without the interpreter and its time against the sort (sampling_bench.py); then waits for the build.
LOGS=/tmp/s43; source scripts/gpu/prelude.sh
M=${M:-qwen3-30b-a3b}
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/ 2>/dev/null
[ -d /tmp/vsite/vllm ] || bash /tmp/vstage/install.sh > $LOGS/vllm-install.log 2>&1 || tail -5 $LOGS/vllm-install.log
at "vllm installed"
# by its command line: kill -0 on the pid file's pid said it was gone while it ran (the cause was not found)
building() { pgrep -f "build.cli --model /tmp/m/$M " > /dev/null; }
while building && ! tr '\r' '\n' < $LOGS/build-$M.log | grep -q "export (mixed)"; do sleep 5; done
at "tuning done"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_sampling_threshold.py > $LOGS/sampling-tests.log 2>&1
at "sampling tests rc=$?"; tail -2 $LOGS/sampling-tests.log
timeout 120 python3 scripts/gpu/sampling_bench.py --out $OUT/sampling-bench.json > $LOGS/sampling-bench.log 2>&1
at "sampling bench rc=$?"; cut -c1-300 $LOGS/sampling-bench.log | tail -14
while building && [ $(( $(date +%s) - S )) -lt ${WAIT:-560} ]; do sleep 5; done
at "waited"; tr '\r' '\n' < $LOGS/build-$M.log | grep -v '^\s*$' \
  | grep -E "^stages|rror|compile|export" | tail -3 | cut -c1-300
