#!/usr/bin/env bash
# Session 44, call I (the same machine as G): after G, the start's KV sizing frees the allocator's cached blocks
# first and reserves the larger of the mixed step's and the sampler's measured memory (not their sum): the
# throughput workload traced again, then ours through the shared harness (throughput, TPOT, starts).
LOGS=/tmp/s44; source scripts/gpu/prelude.sh
M=${M:-llama-3.1-8b}
T="timeout 150 python3 scripts/trace_run.py --artifact /tmp/art/$M"
$T --out $OUT/trace-measured2.json --label measured-max-empty-cache > $LOGS/trace-measured2.log 2>&1; at "trace rc=$?"
tail -1 $LOGS/trace-measured2.log | cut -c1-900; grep -E "KV budget|KV cache:" $LOGS/trace-measured2.log | cut -c1-300
timeout $(( 590 - ($(date +%s) - S) )) python3 /tmp/sbs.py ours --model /tmp/m/$M --artifact /tmp/art/$M \
  --out $OUT/sbs-ours-$M-2.json --sections ${SECTIONS:-throughput,tpot,cold} > $LOGS/sbs-ours-$M-2.log 2>&1
at "ours rc=$?"; grep -E "first_token_s|output_tok_s|tpot_s\"|init_s|rror" $LOGS/sbs-ours-$M-2.log | tail -8
