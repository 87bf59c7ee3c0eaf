#!/usr/bin/env bash
# Session 36, calls C-E (carry one of .vllm/bundle.part01, 02, 03 in turn): stage one vLLM part.
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/ && ls /tmp/vstage | tr '\n' ' '
