#!/usr/bin/env bash
# Session 35, calls C-E (carry .vllm/bundle.part02, 03, 04 in turn): stage one vLLM part.
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/ && ls /tmp/vstage | tr '\n' ' '
