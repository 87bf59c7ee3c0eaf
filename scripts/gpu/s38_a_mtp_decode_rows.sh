#!/usr/bin/env bash
# Session 38, call A (one GPU; carry .whl .gpu/tokenizers): MTP's verify steps as decode rows
# (runtime/verify_rows.py) on DeepSeek-V3's shapes, ds5-32e-mtp (5 layers: 3 dense + 2 MoE of 32 experts, one MTP
# layer; weights drawn at load). Batch-1 TPOT without speculation, with MTP K=1 and K=3 through decode rows (the
# default for MLA), and K=1 through the mixed package (ATOM_VERIFY_ROUTE=mixed: session 37's route); greedy output
# with MTP against without (8 prompts x 16 tokens). Each engine's "verify steps:" startup line is kept.
LOGS=/tmp/s38; source scripts/gpu/prelude.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
D="python3 scripts/gpu/deepseek_gpu.py"; M=/tmp/m/ds5-32e-mtp; ART=/tmp/art/ds5-32e-mtp
$D folder --layers 5 --experts 32 --mtp 1 --tokenizer .gpu/tokenizers/llama3 --out $M > /dev/null
[ -d $ART ] || timeout 330 python3 -m atom_aot.build.cli --model $M --max-model-len 4096 --cache-dir /tmp/atom-cache \
  --load-format dummy-at-load --out $ART > $LOGS/build.log 2>&1
at "build rc=$?"; tr '\r' '\n' < $LOGS/build.log | grep -E '^stages|rror' | tail -2 | cut -c1-400
T="python3 scripts/gpu/spec_tpot.py --artifact $ART --vocab 128256"
timeout 200 $T --modes baseline,mtp --k 1 --out $OUT/tpot-k1-decode-rows.json > $LOGS/tpot-k1.log 2>&1
at "tpot k1 decode rows rc=$?"
timeout 100 $T --modes mtp --k 3 --out $OUT/tpot-k3-decode-rows.json > $LOGS/tpot-k3.log 2>&1
at "tpot k3 decode rows rc=$?"
ATOM_VERIFY_ROUTE=mixed timeout 100 $T --modes mtp --k 1 --out $OUT/tpot-k1-mixed.json > $LOGS/tpot-k1-mixed.log 2>&1
at "tpot k1 mixed rc=$?"
python3 scripts/gpu/tpot_summary.py $OUT/tpot-*.json
grep -h "verify steps" $LOGS/tpot-*.log | sort | uniq -c | cut -c1-300
timeout 150 $D mtp --artifact $ART --out $OUT/mtp-greedy.json --k 1,3 > $LOGS/mtp.log 2>&1
at "mtp greedy rc=$?"; grep -E "greedy_equal|sequences_equal|acceptance_rate|rror" $LOGS/mtp.log | head -8
grep -h "verify steps" $LOGS/mtp.log | sort | uniq -c | cut -c1-300
tail -c 4000 $LOGS/build.log > $OUT/build.log.tail
