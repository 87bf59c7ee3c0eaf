#!/usr/bin/env bash
# Staging for GPU benchmark runs (python -m atom_aot.bench.gpu), the one place these steps live.
# The GPU machines have torch and no network, and take at most 64 MiB of files per command, so what they lack
# travels in git-ignored folders of the checkout, named in the device tool's `carry`:
#   .whl   wheels the image lacks (zstandard; cryptography for artifact signatures), installed into /tmp/site
#   .gpu   configs/ and tokenizers/ of the benchmark models (the runner's --assets)
#   .vllm  the vLLM 0.24 bundle (../shared/tools/vllm-peer): bundle.part00..NN of 38 MiB, SHA256SUMS, install.sh
#
#   bash scripts/gpu/stage.sh prepare [MODELS_DIR]   here, once: fill .whl, .gpu and .vllm (needs the package index)
#   bash scripts/gpu/stage.sh wheels                 GPU machine: install .whl into /tmp/site (once per machine)
#   bash scripts/gpu/stage.sh part                   GPU machine: copy the carried .vllm files into /tmp/vstage
#   bash scripts/gpu/stage.sh install                GPU machine: copy them too, check every part, install /tmp/vsite
#   eval "$(bash scripts/gpu/stage.sh env)"          GPU machine: PYTHONPATH for our engine (the runner adds vLLM's)
# One command carries one bundle part (38 MiB), so a vLLM run is: part00 with `part` (and whatever else that call
# runs), parts 01.. one per call with `part`, the last part with `install` and the run itself. The machine keeps
# /tmp only while it stays warm (30 s after a call): send these calls back to back.
set -euo pipefail
MODELS=${2:-../shared/models}

prepare() {
  grep -qx "/.vllm/" .gitignore || { echo "stage.sh: run from the repository root" >&2; exit 2; }
  mkdir -p .whl .gpu/configs .gpu/tokenizers
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    zstandard==0.25.0 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12
  cp "$MODELS"/configs/*.json .gpu/configs/
  for t in "$MODELS"/tokenizers/*/; do
    mkdir -p ".gpu/tokenizers/$(basename "$t")" && cp "$t"tokenizer*.json ".gpu/tokenizers/$(basename "$t")/"
  done
  ls .vllm/bundle.part00 >/dev/null 2>&1 || bash ../shared/tools/vllm-peer/make_bundle.sh .vllm
  du -sh .whl .gpu .vllm/bundle.part*
}

case "${1:-}" in
  prepare) prepare ;;
  wheels)
    # the marker names the wheels installed: a changed .whl installs again
    [ "$(cat /tmp/site/.installed 2>/dev/null)" = "$(ls .whl)" ] || { python3 -m pip install -q --no-index --no-deps \
      --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && ls .whl > /tmp/site/.installed; } ;;
  part|install)
    mkdir -p /tmp/vstage
    cp .vllm/bundle.part?? .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ 2>/dev/null || true
    ls /tmp/vstage | tr '\n' ' '; echo
    if [ "$1" = install ]; then
      missing=$(cd /tmp/vstage && awk '{print $2}' SHA256SUMS | while read -r p; do [ -f "$p" ] || echo "$p"; done)
      [ -z "$missing" ] || { echo "stage.sh: bundle parts not staged yet: $missing" >&2; exit 3; }
      [ -d /tmp/vsite/vllm ] || bash /tmp/vstage/install.sh
    fi ;;
  env) echo "export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1" ;;
  *) sed -n '2,17p' "$0"; exit 2 ;;
esac
