#!/usr/bin/env bash
# Session 46, call F (carry .vllm/bundle.part04 and .whl): waits for call A's head-major GPU test; if it passed,
# starts the Llama-3.1-8B FP8 build (W8A8 + fp8 KV, random weights stored in the artifact, as session 44's call A)
# detached, installs vLLM 0.24.0 (/tmp/vsite) while it compiles, then waits for the build (WAIT seconds).
LOGS=/tmp/s44; source scripts/gpu/prelude.sh
M=llama-3.1-8b ART=llama-fp8
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/ 2>/dev/null
while [ ! -f $LOGS/gpu-fp8-pages.rc ] && [ $(( $(date +%s) - S )) -lt 300 ]; do sleep 3; done
at "head-major test rc=$(cat $LOGS/gpu-fp8-pages.rc 2>/dev/null)"; tail -5 $LOGS/gpu-fp8-pages.log | cut -c1-300
cp $LOGS/gpu-fp8-pages.log $OUT/ 2>/dev/null
[ "$(cat $LOGS/gpu-fp8-pages.rc 2>/dev/null)" = 0 ] || [ "${FORCE:-0}" = 1 ] || exit 4
rm -rf /tmp/src && mkdir /tmp/src && cp -r $(ls -A | grep -vxE "\.vllm|\.git|\.gpu") /tmp/src/
(cd /tmp/src && PYTHONPATH=/tmp/site:/tmp/src setsid nohup timeout 1500 python3 -m atom_aot.build.cli --model /tmp/m/$M \
   --load-format dummy --max-model-len 4096 --cache-dir /tmp/atom-cache --out /tmp/art/$ART --quant fp8 --kv-cache-dtype fp8 \
   > $LOGS/build-$M.log 2>&1 < /dev/null & echo $! > /tmp/build-$M.pid)
at "build started"
[ -d /tmp/vsite/vllm ] || bash /tmp/vstage/install.sh > $LOGS/vllm-install.log 2>&1 || tail -5 $LOGS/vllm-install.log
at "vllm installed"
while pgrep -f "build.cli --model /tmp/m/$M " > /dev/null && [ $(( $(date +%s) - S )) -lt ${WAIT:-560} ]; do sleep 5; done
at "waited"; tr '\r' '\n' < $LOGS/build-$M.log | grep -v '^\s*$' | grep -E "^stages|rror|graph probe|build:|head-major|pages" | tail -6 | cut -c1-400
