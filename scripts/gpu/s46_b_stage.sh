#!/usr/bin/env bash
# Session 46, calls B-E (each carries one of .vllm/bundle.part00..03): stage that part of vLLM while call A's
# head-major GPU test runs; prints the test's progress.
LOGS=/tmp/s44; mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/ 2>/dev/null
ls /tmp/vstage | tr '\n' ' '; echo; cat $LOGS/gpu-fp8-pages.rc 2>/dev/null; tail -c 600 $LOGS/gpu-fp8-pages.log; echo; uptime
