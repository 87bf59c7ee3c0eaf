#!/usr/bin/env bash
# Session 37, call D on a fresh machine (carry .whl .gpu/tokenizers .vllm/bundle.part05 .vllm/SHA256SUMS
# .vllm/install.sh .vllm/sbs.py): the 256-expert DeepSeek-shaped model with the SAME weights for both engines.
# vLLM's load_format="dummy" draws every parameter uniform in +-1e-3, router and e_score_correction_bias too, so
# the constant bias outweighs the token's scores and every token picks about the same 8 experts: its MoE then
# reads a few experts per step where ours (normal draws) reads all 256. Here the random checkpoint is written to
# disk (scripts/make_random_model.py on the GPU: the tensors our dummy-at-load artifact draws) for vLLM to load
# (call E). Ours: throughput, TPOT, cold start, prefill only, a batch-256 decode profile, the tuning's MLA rows.
# Call F: ours after the MLA decode configs per batch bucket (SECTIONS=throughput,tpot NO_CHECKPOINT=1).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/vstage /tmp/s37 /tmp/art /tmp/m && cp .vllm/bundle.part05 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s); at() { echo "$1 at $(( $(date +%s) - S )) s"; }
D="python3 scripts/gpu/deepseek_gpu.py"; CFG=/tmp/m/ds5-256e; CKPT=/tmp/m/ds5-256e-ckpt
$D folder --layers 5 --experts 256 --mtp 0 --tokenizer .gpu/tokenizers/llama3 --out $CFG > /dev/null
timeout 400 python3 -m atom_aot.build.cli --max-model-len 4096 --cache-dir /tmp/atom-cache --model $CFG \
  --load-format dummy-at-load --out /tmp/art/ds5-256e > /tmp/s37/build-256e.log 2>&1 &
PB=$!
[ "$NO_CHECKPOINT" = 1 ] || timeout 300 $D folder --weights --hub-expert-names --layers 5 --experts 256 --mtp 0 --tokenizer .gpu/tokenizers/llama3 --out $CKPT > /tmp/s37/ckpt.log 2>&1
at "checkpoint rc=$? $(du -sh $CKPT | cut -f1) $(df -h /tmp | tail -1 | awk '{print $4}') free"
wait $PB; at "build rc=$?"; tr '\r' '\n' < /tmp/s37/build-256e.log | grep -E '^stages|rror|does not fit' | tail -3 | cut -c1-400
python3 -c "
import json; t = json.load(open('/tmp/art/ds5-256e/tuning.json'))
print('decode row', t['phases']['decode']['mla_attention']); m = t['measurements_ms']['mla_decode']
for b, row in m.items(): print(b, {k: (round(v, 4) if v else v) for k, v in row.items()})" 2>&1 | tee $OUT/tuning-mla.txt | cut -c1-600
R="python3 /tmp/sbs.py ours --model $CFG --artifact /tmp/art/ds5-256e"
timeout 200 $R --out $OUT/sbs-ours-ds5-256e-same-weights.json --sections ${SECTIONS:-cold,throughput,tpot} > /tmp/s37/sbs-ours.log 2>&1
at "ours sbs rc=$?"; grep -E "first_token_s|output_tok_s|tpot_s\"|init_s|rror" /tmp/s37/sbs-ours.log | tail -6
timeout 60 $R --out $OUT/sbs-ours-ds5-256e-prefill-only.json --sections throughput --output-len 1 > /tmp/s37/prefill.log 2>&1
at "prefill only rc=$?"; grep -E "\"seconds|rror" /tmp/s37/prefill.log | tail -2
timeout $(( 585 - ($(date +%s) - S) )) python3 scripts/profile_decode.py --artifact /tmp/art/ds5-256e --out $OUT/profile-ds5-256e-b256.json --sections step,kernels > /tmp/s37/prof.log 2>&1
at "profile rc=$?"; python3 -c "
import json; d = json.load(open('$OUT/profile-ds5-256e-b256.json')); print(d['step']['wall_ms_per_step_median'])
for r in d['kernels']['top_kernels'][:6]: print(round(r['ms_per_step'], 3), r['calls_per_step'], r['name'][:60])" 2>&1 | tail -8
