#!/usr/bin/env bash
# Session 43, call G: waits for call A's build, then ours through the shared harness: fresh-process starts (three),
# throughput 256 x 1024/512 and batch-1 TPOT; the build's stages and `inspect` beside them.
LOGS=/tmp/s43; source scripts/gpu/prelude.sh
M=${M:-qwen3-30b-a3b}
while pgrep -f "build.cli --model /tmp/m/$M " > /dev/null && [ $(( $(date +%s) - S )) -lt ${WAIT:-300} ]; do sleep 5; done
at "build done"; tr '\r' '\n' < $LOGS/build-$M.log | grep -v '^\s*$' | tail -4 | cut -c1-400
cp $LOGS/build-$M.log $OUT/build-$M.log; [ -d /tmp/art/$M ] || exit 3
[ $(( $(date +%s) - S )) -gt ${MAXSTART:-330} ] && { at "too little of the call left: run it again"; exit 4; }
python3 -m atom_aot.entrypoints.run_cli /tmp/art/$M inspect > $OUT/inspect-$M.txt 2>&1; head -c 1500 $OUT/inspect-$M.txt
timeout $(( 590 - ($(date +%s) - S) )) python3 /tmp/sbs.py ours --model /tmp/m/$M --artifact /tmp/art/$M \
  --out $OUT/sbs-ours-$M.json --sections ${SECTIONS:-throughput,tpot,cold} > $LOGS/sbs-ours-$M.log 2>&1
at "ours rc=$?"; grep -E "first_token_s|output_tok_s|tpot_s\"|init_s|rror" $LOGS/sbs-ours-$M.log | tail -8
