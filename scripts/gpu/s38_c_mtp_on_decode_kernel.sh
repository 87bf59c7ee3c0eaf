#!/usr/bin/env bash
# Session 38, call C (one GPU; carry .whl .gpu/tokenizers): after call A, the MTP step itself runs the decode
# row's kernels (its package exported one query row per sequence: the MLA decode kernel, no host sync). ds5-32e-mtp
# rebuilt; batch-1 TPOT without speculation and with MTP K=1, K=3 (verify as decode rows in CUDA graphs); where a
# step goes (scripts/gpu/spec_step_parts.py, K=1 and K=3); greedy with MTP against without, and the noise floor
# (without speculation, each prompt alone against the batch of 8).
# Call D: P=d, the same after the MTP step got its CUDA graphs (spec/mtp_graphs.py; a runtime change).
LOGS=/tmp/s38; P=${P:-c}; source scripts/gpu/prelude.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
D="python3 scripts/gpu/deepseek_gpu.py"; M=/tmp/m/ds5-32e-mtp; ART=/tmp/art/ds5-32e-mtp-$P
$D folder --layers 5 --experts 32 --mtp 1 --tokenizer .gpu/tokenizers/llama3 --out $M > /dev/null
timeout 330 python3 -m atom_aot.build.cli --model $M --max-model-len 4096 --cache-dir /tmp/atom-cache \
  --load-format dummy-at-load --out $ART > $LOGS/build-$P.log 2>&1
at "build rc=$?"; tr '\r' '\n' < $LOGS/build-$P.log | grep -E '^stages|rror' | tail -2 | cut -c1-400
T="python3 scripts/gpu/spec_tpot.py --artifact $ART --vocab 128256"
timeout 150 $T --modes baseline,mtp --k 1 --out $OUT/$P-tpot-k1.json > $LOGS/$P-tpot-k1.log 2>&1; at "tpot k1 rc=$?"
timeout 100 $T --modes mtp --k 3 --out $OUT/$P-tpot-k3.json > $LOGS/$P-tpot-k3.log 2>&1; at "tpot k3 rc=$?"
rm -f $OUT/*.json.*
python3 scripts/gpu/tpot_summary.py $OUT/$P-tpot-*.json
for k in 1 3; do timeout 60 python3 scripts/gpu/spec_step_parts.py --artifact $ART --vocab 128256 --k $k \
  --out $OUT/$P-parts-k$k.json > $LOGS/$P-parts-k$k.log 2>&1; at "parts k$k rc=$?"
  python3 -c "import json; d=json.load(open('$OUT/$P-parts-k$k.json')); print(d['steps'], d['ms_per_step'])" 2>&1 | tail -1; done
grep -h -E "verify steps|MTP step" $LOGS/$P-*.log | sort | uniq -c | cut -c1-300
timeout 120 $D mtp --artifact $ART --out $OUT/$P-mtp-greedy.json --k 1,3 > $LOGS/$P-mtp.log 2>&1
at "mtp greedy rc=$?"; grep -E "greedy_equal|sequences_equal|acceptance_rate|rror" $LOGS/$P-mtp.log | head -8
