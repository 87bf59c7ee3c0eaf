#!/usr/bin/env bash
# Session 29, calls D-G: one vLLM bundle part each (carry that part); where the detached MoE build stands.
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/ && ls /tmp/vstage | wc -l
grep -v "it/s\]" /tmp/build-moe.log 2>/dev/null | tail -2; kill -0 $(cat /tmp/build-moe.pid 2>/dev/null) 2>/dev/null && echo "moe build running" || echo "moe build not running"
