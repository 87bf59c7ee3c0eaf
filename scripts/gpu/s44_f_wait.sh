#!/usr/bin/env bash
# Session 44, call F (carry .vllm/bundle.part04 and A's carry): vLLM 0.24.0 installed (/tmp/vsite) while call A's
# build compiles, then waits for the build (its probe's step-memory line and stages printed).
LOGS=/tmp/s44; source scripts/gpu/prelude.sh
M=${M:-llama-3.1-8b}
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/ 2>/dev/null
[ -d /tmp/vsite/vllm ] || bash /tmp/vstage/install.sh > $LOGS/vllm-install.log 2>&1 || tail -5 $LOGS/vllm-install.log
at "vllm installed"
while pgrep -f "build.cli --model /tmp/m/$M " > /dev/null && [ $(( $(date +%s) - S )) -lt ${WAIT:-560} ]; do sleep 5; done
at "waited"; tr '\r' '\n' < $LOGS/build-$M.log | grep -v '^\s*$' | grep -E "^stages|rror|graph probe|build:" | tail -5 | cut -c1-400
