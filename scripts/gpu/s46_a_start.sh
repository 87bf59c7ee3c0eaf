#!/usr/bin/env bash
# Session 46, one H100, call A (carry .whl .gpu/configs .gpu/tokenizers .vllm/bundle.part05 .vllm/SHA256SUMS
# .vllm/install.sh .vllm/sbs.py): head-major fp8 pages (3a95344, restored) checked on the GPU first: the tiny
# float32 Llama with an fp8 KV cache built for this GPU, its compiled graphs against its eager module
# (tests/test_gpu.py -k head_major), detached so that calls B-E stage vLLM meanwhile; call F starts the
# Llama-3.1-8B FP8 build only if it passed. Logs in /tmp/s44 so that s44_j / s44_k run unchanged.
LOGS=/tmp/s44; source scripts/gpu/prelude.sh
M=llama-3.1-8b TOK=llama3
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; df -h /tmp | tail -1
mkdir -p /tmp/vstage /tmp/m/$M && cp .vllm/bundle.part05 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
cp .gpu/tokenizers/$TOK/* /tmp/m/$M/ && cp .gpu/configs/$M.json /tmp/m/$M/config.json
rm -rf /tmp/test-src && mkdir /tmp/test-src && cp -r $(ls -A | grep -vxE "\.vllm|\.git|\.gpu") /tmp/test-src/
(cd /tmp/test-src && PYTHONPATH=/tmp/site:/tmp/test-src setsid nohup bash -c 'timeout 600 python3 -m pytest -q -x -p no:cacheprovider \
   tests/test_gpu.py -k head_major > /tmp/s44/gpu-fp8-pages.log 2>&1; echo $? > /tmp/s44/gpu-fp8-pages.rc' > /dev/null 2>&1 < /dev/null &)
at "head-major test started"; sleep 15; tail -3 $LOGS/gpu-fp8-pages.log | cut -c1-200
