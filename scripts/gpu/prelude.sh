#!/usr/bin/env bash
# Sourced by a session's GPU scripts (from session 38 on): the carried wheels installed once per machine,
# the repo on PYTHONPATH, unbuffered Python, a log folder, and `at MSG` printing MSG with the seconds since
# the script began. LOGS names the folder (default /tmp/run).
[ -f /tmp/site/.installed ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && touch /tmp/site/.installed; } || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
LOGS=${LOGS:-/tmp/run}; mkdir -p "$LOGS" /tmp/art /tmp/m
S=$(date +%s); at() { echo "$1 at $(( $(date +%s) - S )) s"; }
