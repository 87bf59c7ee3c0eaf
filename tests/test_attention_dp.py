"""Data-parallel attention with expert parallelism (`atom-build -dp N --ep`) on the CPU: every rank an
engine core of its own sequences, the expert layers gathering every rank's tokens (all-gather) and
handing back each rank's sums (reduce-scatter). Served by `atom-run ART serve` as N engine processes
(gloo); greedy output equals the single-rank artifact's under concurrent load, padding steps leave the
real rows alone, and the refusals name what does not fit."""
from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from safetensors.torch import load_file
from test_server_support import ServerProcess

from atom_aot.artifact.reader import Artifact
from atom_aot.build.config import BuildConfig
from atom_aot.build.pipeline import plan
from atom_aot.entrypoints.llm import LLMEngine
from atom_aot.errors import BuildError, StartupError
from atom_aot.models import model_class
from atom_aot.models.parallel import Split
from atom_aot.runtime.parallel.attention_dp import pad_to, padding_only
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.weights.shard import shard_state_dict
from factories import make_tiny_model, random_prompts
from moe_checks import one_layer_qwen3_moe

QWEN3_MOE = dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=32, norm_topk_prob=True,
                 mlp_only_layers=[1])
ENGINE = dict(num_kv_blocks=64, num_threads=1)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("attention-dp") / "qwen3moe", "Qwen3MoeForCausalLM", seed=7,
                           **QWEN3_MOE)


@pytest.fixture(scope="module")
def dp2_artifact(moe_dir, build_artifact):
    """Compiled (AOTInductor): the gather and reduce-scatter run inside the package."""
    return build_artifact(moe_dir, compile="aoti", data_parallel_size=2, enable_expert_parallel=True)


def test_a_dp2_artifact_holds_whole_attention_and_half_the_experts_per_rank(dp2_artifact, moe_dir, build_artifact):
    manifest = Artifact.open(dp2_artifact).manifest
    layout = manifest.layout
    assert (layout.tensor_parallel_size, layout.data_parallel_size, layout.expert_parallel_size) == (1, 2, 2)
    assert layout.attention_data_parallel and "-tp1-dp2-ep-" in dp2_artifact.name
    assert len(manifest.compiled.packages) == 1          # one package serves both ranks
    one_rank = Artifact.open(build_artifact(moe_dir, compile="none"))
    whole = load_file(str(one_rank.member_path("weights/rank0.safetensors")))
    for rank in range(2):
        part = load_file(str(Artifact.open(dp2_artifact).member_path(f"weights/rank{rank}.safetensors")))
        torch.testing.assert_close(part["model.layers.0.self_attn.qkv_proj.weight"],
                                   whole["model.layers.0.self_attn.qkv_proj.weight"], rtol=0, atol=0)
        torch.testing.assert_close(part["model.layers.0.mlp.experts.w13"],
                                   whole["model.layers.0.mlp.experts.w13"][4 * rank:4 * (rank + 1)], rtol=0, atol=0)
        assert int(part["model.layers.0.mlp.experts.expert_start"]) == 4 * rank
        assert "model.embed_tokens.vocab_start" not in part


def test_the_ranks_expert_outputs_reduce_scattered_make_the_whole_layer():
    """Two ranks' eager MoE blocks on the whole model's shards, with the collectives done by hand: rank r's
    partial sums over both ranks' tokens, summed and split, are the whole layer's output for its tokens."""
    cfg, whole = one_layer_qwen3_moe()
    tokens = [torch.randn(5, 32), torch.randn(5, 32)]             # each rank's own tokens
    expected = whole.model.layers[0].mlp(torch.cat(tokens))
    partial = []
    for rank in range(2):
        with torch.device("meta"):
            part = model_class(cfg.architecture)(cfg, torch.float32, split=Split(ep=True, dp=2))
        part.load_state_dict(shard_state_dict(whole.state_dict(), cfg, Split(ep=True, dp=2), rank), assign=True)
        partial.append(part.model.layers[0].mlp.experts(torch.cat(tokens), *_route(part, torch.cat(tokens))))
    torch.testing.assert_close(partial[0] + partial[1], expected, rtol=1e-5, atol=1e-5)


def _route(model, hidden):
    from atom_aot.ops.moe import softmax_topk
    block = model.model.layers[0].mlp
    return softmax_topk(block.gate(hidden), block.top_k, block.renormalize)


def test_padding_sequences_leave_the_real_rows_and_the_cache_alone():
    from model_factories import mixed_step, tiny_model
    model = tiny_model(seed=3)
    inputs = mixed_step(model)
    cache = inputs.kv_cache
    before = cache.clone()
    with torch.no_grad():
        expected = model(inputs)
        written = cache.clone()
        cache.copy_(before)
        padded = pad_to(inputs, inputs.input_ids.shape[0] + 5)
        assert padded.input_ids.shape[0] == inputs.input_ids.shape[0] + 5
        assert padded.seq_lens.shape[0] == inputs.seq_lens.shape[0] + 5
        torch.testing.assert_close(model(padded), expected, rtol=1e-5, atol=1e-5)   # M changes GEMM blocking
        assert torch.equal(cache != 0, written != 0)             # padding writes no slot of its own
        torch.testing.assert_close(cache, written, rtol=1e-5, atol=1e-5)
        kept = cache.clone()
        assert model(padding_only(cache, 4)).shape[0] == 0
        assert torch.equal(cache, kept)


def test_what_does_not_run_data_parallel_is_refused_by_name(moe_dir, tmp_path, dp2_artifact):
    with pytest.raises(BuildError, match="add --ep"):
        plan(str(moe_dir), BuildConfig(arch="cpu", data_parallel_size=2))
    with pytest.raises(ValueError, match="not both"):
        BuildConfig(arch="cpu", data_parallel_size=2, tensor_parallel_size=2, enable_expert_parallel=True)
    with pytest.raises(BuildError, match="not a multiple of dp"):
        plan(str(moe_dir), BuildConfig(arch="cpu", data_parallel_size=3, enable_expert_parallel=True))
    dense = make_tiny_model(tmp_path / "dense", "Qwen3ForCausalLM")
    with pytest.raises(BuildError, match="has no experts"):
        plan(str(dense), BuildConfig(arch="cpu", data_parallel_size=2, enable_expert_parallel=True))
    from atom_aot.runtime.assembly import start_core
    with pytest.raises(StartupError, match="atom-run .* serve` and the offline LLMEngine start them"):
        start_core(dp2_artifact, __import__("atom_aot.runtime.config", fromlist=["x"]).RuntimeConfig())
    with pytest.raises(ValueError, match="torch_profiler_dir: the ranks"):
        LLMEngine(str(dp2_artifact), torch_profiler_dir=str(tmp_path / "traces"), **ENGINE)


def _one_rank_texts(artifact, prompts: list[list[int]], max_tokens: list[int]) -> list[str]:
    """Each prompt's greedy text from the one-rank artifact, alone in its batch."""
    engine = LLMEngine(str(artifact), **ENGINE)
    try:
        return [engine.generate([p], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))[0]["text"]
                for p, n in zip(prompts, max_tokens)]
    finally:
        engine.close()


def _served_tokens(server: ServerProcess, model: str, prompts: list[list[int]], max_tokens: list[int]) -> list:
    def complete(i):
        body = {"model": model, "prompt": prompts[i], "max_tokens": max_tokens[i], "temperature": 0,
                "ignore_eos": True, "logprobs": 0}
        response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"]
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(complete, range(len(prompts))))


def test_dp2_serving_under_concurrent_load_equals_one_rank(dp2_artifact, moe_dir, build_artifact, tmp_path):
    """Prompts of 3-60 tokens and 2-12 new tokens: the ranks' steps differ in size (padding), and one rank
    goes idle while the other still runs (padding-only steps)."""
    prompts = random_prompts(8, 300, seed=3)
    max_tokens = [2 + (5 * i) % 11 for i in range(len(prompts))]
    expected = _one_rank_texts(build_artifact(moe_dir, compile="none"), prompts, max_tokens)
    server = ServerProcess(dp2_artifact, tmp_path, api_key=None).wait_healthy(timeout=300)
    try:
        model = Artifact.open(dp2_artifact).manifest.model.name
        assert _served_tokens(server, model, prompts, max_tokens) == expected
        assert _served_tokens(server, model, prompts[:3], max_tokens[:3]) == expected[:3]   # after idling
        assert "atom_kv_cache_blocks_total 1024.0" in httpx.get(f"{server.url}/metrics").text   # 512 per rank
        assert len(_engine_processes(server)) == 2
        server.proc.send_signal(signal.SIGINT)          # the ranks leave their loop together
        assert server.proc.wait(30) == 0, server.log()
    finally:
        server.stop()


def test_the_offline_engine_runs_the_ranks_as_engine_processes(dp2_artifact, moe_dir, build_artifact):
    """LLMEngine on a -dp 2 artifact: its two ranks in engine processes (as the server runs them), a batch of
    prompts spread over them, greedy texts equal to the one-rank artifact's; a prompt over the context is
    refused as by any engine."""
    from atom_aot.errors import ContextLengthError
    prompts = random_prompts(6, 300, seed=23)
    max_tokens = [4 + i for i in range(len(prompts))]
    expected = _one_rank_texts(build_artifact(moe_dir, compile="none"), prompts, max_tokens)
    engine = LLMEngine(str(dp2_artifact), **ENGINE)
    try:
        assert "2 data-parallel ranks" in engine.loaded.execution
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
        assert [out["text"] for out in engine.generate(prompts, params)] == expected
        with pytest.raises(ContextLengthError):
            engine.generate([list(range(3, 200)) * 5], SamplingParams(max_tokens=4))
        assert [out["text"] for out in engine.generate(prompts[:2], params[:2])] == expected[:2]
    finally:
        engine.close()


def test_atom_run_generate_runs_the_ranks_and_prints_one_ranks_greedy_texts(dp2_artifact, moe_dir, build_artifact):
    import subprocess
    import sys
    prompts, max_tokens = ["The quick brown fox", "Paged attention stores keys"], 6
    engine = LLMEngine(str(build_artifact(moe_dir, compile="none")), **ENGINE)
    try:
        expected = [out["text"] for out in engine.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens,
                                                                                   ignore_eos=True))]
    finally:
        engine.close()
    out = subprocess.run([sys.executable, "-m", "atom_aot.entrypoints.run_cli", str(dp2_artifact), "generate", *prompts,
                          "--max-tokens", str(max_tokens), "--ignore-eos", "--num-kv-blocks", "64", "--num-threads", "1"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    for prompt, text in zip(prompts, expected):
        assert f"--- {prompt!r}\n{text}\n[{max_tokens} tokens" in out.stdout
    assert "2 data-parallel ranks" in out.stderr and "runtime compilations (rank 0's process)" in out.stderr


def test_deepseek_with_latent_attention_serves_dp2_equal_to_one_rank(build_artifact, tmp_path_factory, tmp_path):
    """DeepSeek-V3 (MLA, grouped routing, a shared expert, dense first layers): each rank's whole latent
    attention, the routed experts spread over the ranks, the shared expert on the rank's own tokens."""
    from deepseek_factories import make_tiny_deepseek
    model_dir = make_tiny_deepseek(tmp_path_factory.mktemp("attention-dp-deepseek") / "deepseek", seed=4)
    prompts = random_prompts(6, 300, seed=5)
    max_tokens = [3 + (4 * i) % 9 for i in range(len(prompts))]
    expected = _one_rank_texts(build_artifact(model_dir, compile="none"), prompts, max_tokens)
    dp2 = build_artifact(model_dir, compile="none", data_parallel_size=2, enable_expert_parallel=True)
    server = ServerProcess(dp2, tmp_path, api_key=None).wait_healthy(timeout=300)
    try:
        model = Artifact.open(dp2).manifest.model.name
        assert _served_tokens(server, model, prompts, max_tokens) == expected
    finally:
        server.stop()


def test_dp2_under_preemption_chunked_prefill_streams_and_aborts(dp2_artifact, moe_dir, build_artifact, tmp_path):
    """Each rank's KV pool holds fewer tokens than its requests need (preemption and recomputation on one rank
    while the other steps), prompts longer than a step's token budget (chunked prefill: the ranks' steps differ
    in size), a streamed request, and one abandoned mid-stream (its rank aborts it): the others' greedy texts
    equal the one-rank artifact's, and the server keeps serving."""
    prompts = random_prompts(10, 300, seed=17, lengths=(20, 90))
    max_tokens = [60] * len(prompts)       # 5 sequences per rank growing to 80-150 tokens: > 192 slots each
    expected = _one_rank_texts(build_artifact(moe_dir, compile="none"), prompts, max_tokens)
    server = ServerProcess(dp2_artifact, tmp_path, api_key=None,
                           runtime={"num_kv_blocks": 12, "max_num_batched_tokens": 48,
                                    "max_model_len": 160}).wait_healthy(timeout=300)
    try:
        model = Artifact.open(dp2_artifact).manifest.model.name
        body = {"model": model, "prompt": prompts[0], "max_tokens": 60, "temperature": 0, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as abandoned:
            assert abandoned.status_code == 200
            next(abandoned.iter_lines())                      # it started; the client goes away
        assert _served_tokens(server, model, prompts, max_tokens) == expected
        streamed = []
        body = {"model": model, "prompt": prompts[3], "max_tokens": 60, "temperature": 0, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    streamed.append(__import__("json").loads(line[6:])["choices"][0]["text"])
        assert "".join(streamed) == expected[3]
        from test_server_support import metric
        time.sleep(1.0)                                       # the ranks' idle heartbeats carry their counters
        assert metric(httpx.get(f"{server.url}/metrics").text, "atom_num_preemptions_total") > 0
        assert server.proc.poll() is None
    finally:
        server.stop()


def test_a_killed_rank_ends_the_server(dp2_artifact, tmp_path):
    server = ServerProcess(dp2_artifact, tmp_path, api_key=None).wait_healthy(timeout=300)
    try:
        ranks = _engine_processes(server)
        assert len(ranks) == 2
        os.kill(int(ranks[1]), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while server.proc.poll() is None:
            assert time.monotonic() < deadline, "the server outlived a killed rank by 60 s:\n" + server.log()
            time.sleep(0.25)
        assert server.proc.returncode == 3                       # as for any engine death
        assert "its engine process exited" in server.log()
    finally:
        server.stop()


def _engine_processes(server: ServerProcess) -> list[str]:
    from pathlib import Path
    children = Path(f"/proc/{server.proc.pid}/task/{server.proc.pid}/children").read_text().split()
    return [pid for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]


class _DecodeGraphsStandIn:
    """A decode forward with CUDA-graph sizes (DecodeGraphs' `sizes`), recording what it ran."""
    sizes = [1, 2, 4, 8]

    def __init__(self):
        self.calls = []

    def __call__(self, inputs):
        self.calls.append(inputs.input_ids.shape[0])
        return torch.zeros(inputs.input_ids.shape[0], 32)


@pytest.mark.parametrize("agreed, runs", [(4, ("decode", 4)), (6, ("mixed", 6)), (8, ("decode", 8))])
def test_a_decode_batch_runs_its_graph_only_at_a_capture_size_the_ranks_agreed(monkeypatch, agreed, runs):
    """3 decode sequences count as their graph size 4; the ranks' largest count decides the path."""
    from atom_aot.runtime.parallel import attention_dp
    from atom_aot.runtime.execution.forwards import Forwards
    from runner_factories import RecordingForward, make_batch, make_runner, make_sequence
    offered = []
    monkeypatch.setattr(attention_dp, "agree", lambda values, group: offered.append(values) or [agreed])
    mixed, decode = RecordingForward(), _DecodeGraphsStandIn()
    runner = make_runner(Forwards(mixed, decode, decode_max_seqs=8))
    runner.forwards = attention_dp.AlignedForwards(runner.forwards, group=None, kv_cache=runner.kv_cache)
    seqs = [make_sequence([5, 6, 7, 8 + i], [i], num_computed_tokens=3, request_id=str(i)) for i in range(3)]
    runner.launch(make_batch(*[(seq, 1) for seq in seqs]))
    assert offered == [[4]]
    ran = ("decode", decode.calls[-1]) if decode.calls else ("mixed", mixed.calls[-1].input_ids.shape[0])
    assert ran == runs
    if runs[0] == "mixed":      # padding rows are not sampled
        assert mixed.calls[-1].logits_indices.tolist() == [0, 1, 2]


@pytest.mark.parametrize("agreed, runs", [(0, None), (2, ("decode", 2)), (3, ("mixed", 3))])
def test_a_rank_with_nothing_to_run_steps_with_padding_only(monkeypatch, agreed, runs):
    from atom_aot.runtime.parallel import attention_dp
    from atom_aot.runtime.execution.forwards import Forwards
    from runner_factories import RecordingForward, make_runner
    monkeypatch.setattr(attention_dp, "agree", lambda values, group: [agreed])
    mixed, decode = RecordingForward(), _DecodeGraphsStandIn()
    runner = make_runner(Forwards(mixed, decode, decode_max_seqs=8))
    aligned = attention_dp.AlignedForwards(runner.forwards, group=None, kv_cache=runner.kv_cache)
    aligned.idle_step()
    ran = (("decode", decode.calls[-1]) if decode.calls else
           ("mixed", mixed.calls[-1].input_ids.shape[0]) if mixed.calls else None)
    assert ran == runs and aligned.steps_run == 1
