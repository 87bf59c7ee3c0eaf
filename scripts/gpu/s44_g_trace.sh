#!/usr/bin/env bash
# Session 44, call G: the throughput workload traced step by step (scripts/trace_run.py): KV blocks, preemptions,
# the tail, GC pauses; with the activation reserve measured at build (the default now), with the KV pool the old
# bound left (--num-kv-blocks from the first run), and with the heap frozen after the warm-up (--gc-freeze).
# Then ours through the shared harness (throughput, TPOT, fresh-process starts) on the same artifact.
LOGS=/tmp/s44; source scripts/gpu/prelude.sh
M=${M:-llama-3.1-8b}
while pgrep -f "build.cli --model /tmp/m/$M " > /dev/null && [ $(( $(date +%s) - S )) -lt ${WAIT:-200} ]; do sleep 5; done
at "build done"; cp $LOGS/build-$M.log $OUT/build-$M.log; [ -d /tmp/art/$M ] || exit 3
python3 -m atom_aot.entrypoints.run_cli /tmp/art/$M inspect > $OUT/inspect-$M.txt 2>&1
T="timeout 150 python3 scripts/trace_run.py --artifact /tmp/art/$M"
$T --out $OUT/trace-measured.json --label measured > $LOGS/trace-measured.log 2>&1; at "trace measured rc=$?"
tail -1 $LOGS/trace-measured.log | cut -c1-900; grep -E "KV budget|KV cache:" $LOGS/trace-measured.log | cut -c1-300
OLD=$(python3 -c "import json; print(json.load(open('$OUT/trace-measured.json'))['memory']['kv_blocks_with_the_bound'])")
$T --out $OUT/trace-bound.json --label bound --num-kv-blocks $OLD > $LOGS/trace-bound.log 2>&1; at "trace bound ($OLD blocks) rc=$?"
tail -1 $LOGS/trace-bound.log | cut -c1-700
$T --out $OUT/trace-measured-gc-freeze.json --label measured-gc-freeze --gc-freeze > $LOGS/trace-gc.log 2>&1
at "trace gc-freeze rc=$?"; tail -1 $LOGS/trace-gc.log | cut -c1-700
[ $(( $(date +%s) - S )) -gt ${MAXSTART:-400} ] && { at "too little of the call left for sbs: run it in the next"; exit 4; }
timeout $(( 590 - ($(date +%s) - S) )) python3 /tmp/sbs.py ours --model /tmp/m/$M --artifact /tmp/art/$M \
  --out $OUT/sbs-ours-$M.json --sections ${SECTIONS:-throughput,tpot,cold} > $LOGS/sbs-ours-$M.log 2>&1
at "ours rc=$?"; grep -E "first_token_s|output_tok_s|tpot_s\"|init_s|rror" $LOGS/sbs-ours-$M.log | tail -8
