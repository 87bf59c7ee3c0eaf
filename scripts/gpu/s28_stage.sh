#!/usr/bin/env bash
# Session 28: one vLLM bundle part per call (carry that part): ../shared/tools/vllm-peer/README.md.
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/ && ls /tmp/vstage | wc -l
