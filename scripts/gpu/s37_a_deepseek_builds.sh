#!/usr/bin/env bash
# Session 37, call A (one GPU; carry .whl .gpu/tokenizers .vllm/bundle.part05 .vllm/SHA256SUMS .vllm/install.sh
# .vllm/sbs.py): stage vLLM part 5. Two DeepSeek-V3-shaped random models, real hidden sizes, 3 dense + 2 MoE layers,
# llama3's tokenizer and vocabulary: ds5-256e (256 routed experts, no MTP layer; weights drawn at load, for the
# throughput / TPOT / vLLM rows) and ds5-32e-mtp (32 routed experts and one MTP layer, a checkpoint on disk, for the
# logits against transformers and MTP speculation). Both build side by side; meanwhile the Triton MLA / MoE kernel
# tests, transformers' reference logits (bf16 and fp32) and the batch-1 roofline. Builds stop before the call's end
# and resume in call B (build/resume.py). Logs in /tmp/s37; artifacts in /tmp/art.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/vstage /tmp/s37 /tmp/art /tmp/m && cp .vllm/bundle.part05 .vllm/SHA256SUMS .vllm/install.sh /tmp/vstage/ && cp .vllm/sbs.py /tmp/sbs.py
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; python3 -c "import transformers, triton; print(transformers.__version__, triton.__version__)"
S=$(date +%s); at() { echo "$1 at $(( $(date +%s) - S )) s"; }
D="python3 scripts/gpu/deepseek_gpu.py"; BIG=/tmp/m/ds5-256e; SMALL=/tmp/m/ds5-32e-mtp
$D folder --layers 5 --experts 256 --mtp 0 --tokenizer .gpu/tokenizers/llama3 --out $BIG > /dev/null
B="python3 -m atom_aot.build.cli --max-model-len 4096 --cache-dir /tmp/atom-cache"
timeout 540 $B --model $BIG --load-format dummy-at-load --out /tmp/art/ds5-256e > /tmp/s37/build-256e.log 2>&1 &
PB=$!
$D roofline --model $BIG --out $OUT/roofline-ds5-256e.json 2>&1 | tail -1
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_triton_mla.py tests/test_triton_moe.py > /tmp/s37/kernel-tests.log 2>&1 &
PT=$!
$D folder --weights --layers 5 --experts 32 --mtp 1 --tokenizer .gpu/tokenizers/llama3 --out $SMALL > /tmp/s37/folder.log 2>&1
at "small checkpoint rc=$? $(du -sh $SMALL | cut -f1)"
timeout 240 $D reference --model $SMALL --out /tmp/ref.json > /tmp/s37/reference.log 2>&1
at "reference rc=$?"; tail -2 /tmp/s37/reference.log | cut -c1-400
wait $PT; at "kernel tests rc=$?"; tail -3 /tmp/s37/kernel-tests.log | cut -c1-300
timeout $(( 565 - ($(date +%s) - S) )) $B --model $SMALL --out /tmp/art/ds5-32e-mtp > /tmp/s37/build-32e.log 2>&1
at "small build rc=$?"
wait $PB; at "big build rc=$?"
for f in 256e 32e; do echo "$f $(tr '\r' '\n' < /tmp/s37/build-$f.log | grep -E '^stages|rror' | tail -2)"; done | tee $OUT/build-stages.txt | cut -c1-600
grep -h -E "mla|moe|MLA|MoE" /tmp/s37/build-*.log | sort | uniq -c | head -10 | cut -c1-300
cp /tmp/s37/kernel-tests.log /tmp/s37/reference.log $OUT/ 2>/dev/null; cp /tmp/ref.json $OUT/reference-ds5-32e-mtp.json 2>/dev/null; ls /tmp/art
tail -c 3000 /tmp/s37/build-256e.log > $OUT/build-256e.log.tail; tail -c 3000 /tmp/s37/build-32e.log > $OUT/build-32e.log.tail
