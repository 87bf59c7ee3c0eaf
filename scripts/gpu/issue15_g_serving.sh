#!/usr/bin/env bash
# Issue 15, GPU call G (after F; vLLM installed in /tmp/vsite): online serving, ours then vLLM, same client
# (atom_aot.bench.serving), random 1024 in / 128 out, 1000 prompts, --max-concurrency 64 and 256, ignore_eos.
# Both servers: max_model_len 4096, max_num_seqs 256, gpu_memory_utilization 0.85. Also vLLM's own
# `vllm bench serve` chat client against our server, for the chat TTFT comparison of issue 17.
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
OURS_PATH=/tmp/site:$PWD:/tmp/vsite
wait_up() { for i in $(seq 1 240); do curl -sf http://127.0.0.1:$1/v1/models >/dev/null && return 0; sleep 0.5; done; return 1; }
bench() {  # port tag concurrency [extra]
  PYTHONPATH=$OURS_PATH timeout 200 python3 -m atom_aot.bench.serving --base-url http://127.0.0.1:$1 --backend vllm \
    --tokenizer /tmp/m/qwen3-0.6b --dataset-name random --random-input-len 1024 --random-output-len 128 \
    --random-range-ratio 1.0 --num-prompts 1000 --max-concurrency $3 --ignore-eos --disable-tqdm \
    --metric-percentiles 50,99 --save-result --result-dir $OUT --result-filename $2-c$3.json $4 2>&1 | grep -E "throughput|TTFT|TPOT|ITL|Successful|Failed" | head -14
}
T0=$(date +%s.%N)
PYTHONPATH=$OURS_PATH python3 -m atom_aot.entrypoints.run_cli /tmp/art/qwen3.atom serve --port 8000 \
  --gpu-memory-utilization 0.85 --max-num-seqs 256 > $OUT/ours-server.log 2>&1 &
OURS=$!
wait_up 8000 || { tail -30 $OUT/ours-server.log; exit 2; }
echo "ours up after $(echo "$(date +%s.%N) - $T0" | bc) s"
for c in 64 256; do echo "== ours c=$c"; bench 8000 ours $c; done
MODEL=$(curl -s http://127.0.0.1:8000/v1/models | python3 -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])")
echo "== vllm bench serve (chat) against ours, model $MODEL"
PYTHONPATH=/tmp/vsite timeout 150 python3 /tmp/vsite/bin/vllm bench serve --backend openai-chat \
  --endpoint /v1/chat/completions --base-url http://127.0.0.1:8000 --model "$MODEL" --tokenizer /tmp/m/qwen3-0.6b \
  --dataset-name random --random-input-len 1024 --random-output-len 128 --num-prompts 200 --max-concurrency 64 \
  --ignore-eos --save-result --result-dir $OUT --result-filename vllmclient-chat-ours-c64.json 2>&1 | grep -E "TTFT|TPOT|throughput" | head -8
echo "== our client (chat) against ours"
PYTHONPATH=$OURS_PATH timeout 150 python3 -m atom_aot.bench.serving --base-url http://127.0.0.1:8000 --backend openai-chat \
  --tokenizer /tmp/m/qwen3-0.6b --dataset-name random --random-input-len 1024 --random-output-len 128 --random-range-ratio 1.0 \
  --num-prompts 200 --max-concurrency 64 --ignore-eos --disable-tqdm --save-result --result-dir $OUT \
  --result-filename ourclient-chat-ours-c64.json 2>&1 | grep -E "TTFT|TPOT|throughput" | head -8
kill -INT $OURS; wait $OURS
T0=$(date +%s.%N)
PYTHONPATH=/tmp/vsite python3 /tmp/vsite/bin/vllm serve /tmp/m/qwen3-0.6b --port 8001 --gpu-memory-utilization 0.85 \
  --max-model-len 4096 --max-num-seqs 256 > $OUT/vllm-server.log 2>&1 &
VLLM=$!
wait_up 8001 || { tail -30 $OUT/vllm-server.log; exit 3; }
echo "vllm up after $(echo "$(date +%s.%N) - $T0" | bc) s"
for c in 64 256; do echo "== vllm c=$c"; bench 8001 vllm $c; done
kill -INT $VLLM; wait $VLLM
