#!/usr/bin/env bash
# Session 26, GPU calls D and E (carry .vllm/bundle.part03, then part04): staging only.
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/ && ls /tmp/vstage
