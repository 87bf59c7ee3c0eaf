#!/usr/bin/env bash
# Session 30, calls D and E (carry .vllm/bundle.part02, then part01): staging only.
mkdir -p /tmp/vstage && cp .vllm/bundle.part0* /tmp/vstage/ && ls -la /tmp/vstage
