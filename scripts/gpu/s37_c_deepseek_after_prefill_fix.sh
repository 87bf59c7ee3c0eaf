#!/usr/bin/env bash
# Session 37, call C on a fresh machine (carry as call A): after the MLA prefill fix (4-d SDPA, is_causal without a
# cached prefix). Both DeepSeek-shaped builds again side by side, transformers' reference, then our logits against it,
# ds5-256e through the shared harness (throughput 256 x 1024/512, batch-1 TPOT) and prefill only (1 output token).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/vstage /tmp/s37 /tmp/art /tmp/m && cp .vllm/bundle.part05 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
S=$(date +%s); at() { echo "$1 at $(( $(date +%s) - S )) s"; }
D="python3 scripts/gpu/deepseek_gpu.py"; BIG=/tmp/m/ds5-256e; SMALL=/tmp/m/ds5-32e-mtp
$D folder --layers 5 --experts 256 --mtp 0 --tokenizer .gpu/tokenizers/llama3 --out $BIG > /dev/null
B="python3 -m atom_aot.build.cli --max-model-len 4096 --cache-dir /tmp/atom-cache"
timeout 400 $B --model $BIG --load-format dummy-at-load --out /tmp/art/ds5-256e > /tmp/s37/build-256e.log 2>&1 &
PB=$!
$D folder --weights --layers 5 --experts 32 --mtp 1 --tokenizer .gpu/tokenizers/llama3 --out $SMALL > /tmp/s37/folder.log 2>&1
timeout 240 $D reference --model $SMALL --out /tmp/ref.json > /tmp/s37/reference.log 2>&1; at "reference rc=$?"
timeout 400 $B --model $SMALL --out /tmp/art/ds5-32e-mtp > /tmp/s37/build-32e.log 2>&1; at "small build rc=$?"
wait $PB; at "big build rc=$?"
timeout 150 $D compare --artifact /tmp/art/ds5-32e-mtp --ref /tmp/ref.json --out $OUT/ds5-32e-mtp-vs-transformers-after.json > /tmp/s37/compare.log 2>&1
at "compare rc=$?"; grep -A4 -E '"(ours_vs|transformers_bf16)' /tmp/s37/compare.log | grep -v prompts | tr -s ' \n' ' '; echo
R="python3 /tmp/sbs.py ours --model $BIG --artifact /tmp/art/ds5-256e"
timeout 150 $R --out $OUT/sbs-ours-ds5-256e-after.json --sections throughput,tpot > /tmp/s37/sbs-ours.log 2>&1
at "ours sbs rc=$?"; grep -E "output_tok_s|tpot_s\"|init_s|rror" /tmp/s37/sbs-ours.log | tail -4
timeout 90 $R --out $OUT/sbs-ours-ds5-256e-prefill-only-after.json --sections throughput --output-len 1 > /tmp/s37/prefill.log 2>&1
at "prefill only rc=$?"; grep -E "\"seconds|rror" /tmp/s37/prefill.log | tail -2
