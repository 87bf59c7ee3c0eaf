"""Tensor parallelism on the CPU: ranks are processes meeting over gloo (each engine with a
tensor-parallel artifact starts its ranks 1..N-1 as `atom-run ART worker` processes).

Greedy output of TP-2 and TP-4 artifacts equals TP-1's on tiny Llama and Qwen3 models (4 ranks
over 2 KV heads replicate them); weights-only (`--compile none`) artifacts. The compiled TP-2 artifact,
whose one package serves both ranks, is tests/test_moe_parallel.py's Qwen3-MoE with a dense layer (its
attention, dense MLP, embedding and lm_head split as a dense Qwen3's do).
"""
from __future__ import annotations

import dataclasses
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

from atom_aot.artifact.phase import Phase
from atom_aot.artifact.reader import Artifact
from atom_aot.build.config import BuildConfig
from atom_aot.build.export import export_model
from atom_aot.build.pipeline import plan
from atom_aot.distributed.group import RankPlace
from atom_aot.entrypoints.llm import LLMEngine
from atom_aot.errors import BuildError, RankFailure
from atom_aot.models import model_class
from atom_aot.models.parallel import Split
from atom_aot.models.step_inputs import StepInputs
from atom_aot.runtime.loading.placement import placement_problem
from atom_aot.runtime.parallel.step_broadcast import SENT
from atom_aot.runtime.sampling_params import SamplingParams
from atom_aot.weights.shard import shard_state_dict
from model_factories import tiny_model

PROMPTS = ["Hello world! How are", "The quick brown fox", "0123456789 + - * / ="]
GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)
ENGINE = dict(num_kv_blocks=64, num_threads=1)


def greedy_tokens(artifact) -> list[list[int]]:
    engine = LLMEngine(str(artifact), **ENGINE)
    try:
        return [out["token_ids"] for out in engine.generate(PROMPTS, GREEDY)]
    finally:
        engine.close()


def rank_model(full, tp: int, rank: int):
    with torch.device("meta"):
        model = model_class(full.config.architecture)(full.config, torch.float32, split=Split(tp))
    model.load_state_dict(shard_state_dict(full.state_dict(), full.config, Split(tp), rank), assign=True)
    return model.eval()


class TestShardStateDict:
    @pytest.mark.parametrize("tp", [2, 4])
    def test_each_rank_matches_the_rank_model_name_for_name_and_shape_for_shape(self, tp):
        full = tiny_model(vocab_size=66)            # 66 rows: padded to a multiple of 4
        for rank in range(tp):
            model = rank_model(full, tp, rank)
            assert model.model.embed_tokens.vocab_start.item() == rank * -(-66 // tp)

    def test_four_ranks_over_two_kv_heads_each_hold_the_kv_head_their_query_heads_read(self):
        full = tiny_model()                         # 4 query heads, 2 KV heads of 32
        qkv = full.state_dict()["model.layers.0.self_attn.qkv_proj.weight"]
        d, q_rows = 32, 4 * 32
        for rank in range(4):
            part = shard_state_dict(full.state_dict(), full.config, Split(4),
                                    rank)["model.layers.0.self_attn.qkv_proj.weight"]
            kv_head = rank // 2
            assert torch.equal(part[:d], qkv[rank * d:(rank + 1) * d])
            assert torch.equal(part[d:2 * d], qkv[q_rows + kv_head * d:q_rows + (kv_head + 1) * d])

    def test_the_ranks_export_the_same_graph_so_one_package_serves_them(self):
        full = tiny_model()
        graphs = [export_model(rank_model(full, 2, rank), torch.float32, 16, 128, torch.device("cpu"),
                               Phase.MIXED).graph_module.code for rank in range(2)]
        assert graphs[0] == graphs[1]
        assert "atom.all_reduce" in graphs[0] and "atom.all_gather" in graphs[0]


class TestStepBroadcast:
    def test_packed_inputs_come_back_equal_and_each_starts_64_bytes_aligned(self):
        from atom_aot.runtime.parallel.step_broadcast import pack, unpack
        g = torch.Generator().manual_seed(3)
        tokens, seqs, max_blocks, logits = 13, 5, 7, 3          # odd sizes: unpadded, every view would be misaligned
        draw = lambda n, dtype: torch.randint(-1, 1000, (n,), generator=g).to(dtype)  # noqa: E731
        kv_cache = torch.zeros(1, dtype=torch.bfloat16)
        sent = StepInputs(input_ids=draw(tokens, torch.int64), positions=draw(tokens, torch.int64), kv_cache=kv_cache,
                          slot_mapping=draw(tokens, torch.int64),
                          block_tables=draw(seqs * max_blocks, torch.int32).view(seqs, max_blocks),
                          seq_lens=draw(seqs, torch.int32), query_start_loc=draw(seqs + 1, torch.int32),
                          logits_indices=draw(logits, torch.int64))
        flat = pack(sent)
        got = unpack(flat, {"num_tokens": tokens, "num_seqs": seqs, "num_seqs_plus_1": seqs + 1,
                            "max_blocks_per_seq": max_blocks, "num_logits": logits}, kv_cache)
        for name in SENT:
            want, value = getattr(sent, name), getattr(got, name)
            assert value.dtype == want.dtype and torch.equal(value, want), name
            if value.dtype == torch.int64:                     # a view of the packed tensor, not a copy
                assert value.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
                assert value.storage_offset() * value.element_size() % 64 == 0, name


class TestBuild:
    def test_the_build_key_and_name_change_with_tp(self, tiny_llama_dir):
        keys = {tp: plan(str(tiny_llama_dir), BuildConfig(arch="cpu", tensor_parallel_size=tp))[2] for tp in (1, 2)}
        assert keys[1] != keys[2]

    def test_a_tp_that_does_not_divide_the_heads_is_refused_before_anything_is_built(self, tiny_llama_dir):
        with pytest.raises(BuildError, match="num_attention_heads 4 is not a multiple of tp"):
            plan(str(tiny_llama_dir), BuildConfig(arch="cpu", tensor_parallel_size=3))

    def test_a_tp2_artifact_has_a_weights_file_per_rank(self, build_artifact, tiny_llama_dir):
        manifest = Artifact.open(build_artifact(tiny_llama_dir, compile="none", tensor_parallel_size=2)).manifest
        assert manifest.layout.tensor_parallel_size == 2
        assert {"weights/rank0.safetensors", "weights/rank1.safetensors"} <= set(manifest.members)


def test_a_gpu_artifact_with_more_ranks_than_gpus_is_refused_with_the_build_that_fits(build_artifact, tiny_llama_dir):
    manifest = Artifact.open(build_artifact(tiny_llama_dir, compile="none", tensor_parallel_size=2)).manifest
    on_gpu = dataclasses.replace(manifest, target=dataclasses.replace(manifest.target, arch="sm90"),
                                 options=dataclasses.replace(manifest.options, arch="sm90"))
    problem = placement_problem(on_gpu, gpus=1)
    assert "its 2 ranks need one GPU each, and this machine has 1" in problem
    assert "atom-build --model" in problem and "--arch sm90" in problem and "-tp" not in problem.split("with:")[1]
    assert placement_problem(on_gpu, gpus=2) is None and placement_problem(manifest, gpus=0) is None


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
def test_greedy_output_of_tp2_and_tp4_equals_tp1(architecture, build_artifact, tiny_llama_dir, tiny_qwen3_dir):
    model = tiny_llama_dir if architecture == "llama" else tiny_qwen3_dir     # 4 heads over 2 KV heads
    expected = greedy_tokens(build_artifact(model, compile="none"))
    for tp in (2, 4):
        assert greedy_tokens(build_artifact(model, compile="none", tensor_parallel_size=tp)) == expected, f"tp={tp}"


FORKED_ENGINE = """
import json, sys
from atom_aot import LLMEngine, SamplingParams
from atom_aot.runtime.parallel.rank_processes import ForkedRank
engine = LLMEngine(sys.argv[1], num_kv_blocks=64, num_threads=1)
children = engine.core.runner.forwards.mixed.lead.children
result = {"forked": [type(c) is ForkedRank for c in children]}
if sys.argv[3] == "kill":
    children[0].kill()
    children[0].wait(10)
    try:
        engine.generate(["Hello"], SamplingParams(max_tokens=2))
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
else:
    outs = engine.generate(json.loads(sys.argv[2]), SamplingParams(max_tokens=6, ignore_eos=True))
    engine.close()
    result.update(exit=[c.wait(10) for c in children], tokens=[o["token_ids"] for o in outs])
print(json.dumps(result))
"""


def _forked_engine(art, what: str) -> dict:
    import json
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", FORKED_ENGINE, str(art), json.dumps(PROMPTS), what],
                         capture_output=True, text=True, timeout=240,
                         env={**os.environ, "ATOM_TP_WORKER_START": "fork"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_forked_ranks_give_the_same_greedy_output_exit_with_the_engine_and_are_watched(build_artifact,
                                                                                       tiny_llama_dir):
    """The start GPU machines use (runtime/parallel/rank_processes.py), forced here on the CPU, each from a fresh
    process as on GPUs (a process that has run a process group spawns its ranks)."""
    expected = greedy_tokens(build_artifact(tiny_llama_dir, compile="none"))
    art = build_artifact(tiny_llama_dir, compile="none", tensor_parallel_size=2)
    assert _forked_engine(art, "generate") == {"forked": [True], "exit": [0], "tokens": expected}
    killed = _forked_engine(art, "kill")
    assert killed["forked"] == [True]
    assert re.match(r"RankFailure: tensor-parallel rank 1 \(pid \d+\) exited with code -9", killed["error"])


def test_the_offline_engine_starts_its_ranks_before_any_thread_of_its_own(monkeypatch, build_artifact, tiny_llama_dir):
    """A thread running when the ranks start makes them new interpreters instead of forks (rank_processes.py):
    the tokenizer's thread and the load's (runtime/parallel/rank_load.py) wait for the ranks, or every -tp 2 start on GPUs
    spawned."""
    import threading
    from atom_aot.runtime.parallel import tp_lead
    seen = []

    def start_method(arch):
        seen.append(sorted(t.name for t in threading.enumerate() if t.name.startswith(("atom-beside", "atom-rank"))))
        return original(arch)
    original = tp_lead.start_method
    monkeypatch.setattr(tp_lead, "start_method", start_method)
    engine = LLMEngine(str(build_artifact(tiny_llama_dir, compile="none", tensor_parallel_size=2)), **ENGINE)
    try:
        assert seen == [[]] and engine.tokenizer is not None
        assert engine.loaded.timings["tokenizer (overlapped)"] >= 0
        assert next(iter(engine.loaded.timings)) == "ranks start + join"     # first in the startup breakdown
        assert engine.loaded.timings["ranks start + join"] > 0
        assert engine.loaded.timings["join + load (wall)"] > 0     # rank 0's load ran beside the join
        parts = [k for k in engine.loaded.timings if k.startswith(("join: ", "ranks start: "))]
        assert parts == ["ranks start: processes", "ranks start: target check + device",
                         "join: process group (with the rendezvous)", "join: peer memory", "join: control group"]
    finally:
        engine.close()


@pytest.mark.parametrize("arch, cuda_context, threads, expected", [
    ("cpu", False, 1, "spawn"), ("sm90", False, 1, "fork"), ("sm90", True, 1, "spawn"), ("sm90", False, 3, "spawn")])
def test_ranks_are_forked_only_on_gpus_from_a_process_without_cuda_context_or_threads(monkeypatch, arch, cuda_context,
                                                                                    threads, expected):
    from atom_aot.runtime.parallel import rank_processes
    monkeypatch.delenv("ATOM_TP_WORKER_START", raising=False)
    monkeypatch.setattr(rank_processes.torch.cuda, "is_initialized", lambda: cuda_context)
    monkeypatch.setattr(rank_processes.threading, "active_count", lambda: threads)
    monkeypatch.setattr(rank_processes, "joined_before", lambda: False)
    assert rank_processes.start_method(arch)[0] == expected
    monkeypatch.setattr(rank_processes, "joined_before", lambda: True)
    assert rank_processes.start_method(arch)[0] == "spawn"
    monkeypatch.setenv("ATOM_TP_WORKER_START", "forkserver")
    with pytest.raises(ValueError, match="ATOM_TP_WORKER_START='forkserver': it must be one of fork, spawn"):
        rank_processes.start_method(arch)


def test_leaving_the_process_group_frees_the_captured_cuda_graphs_first(monkeypatch):
    """NCCL's communicator destroy waits forever on graphs that captured its collectives (pytorch#115388): every
    leave (rank 0's close, a worker's end, a data-parallel rank's, a failed start) frees them before it."""
    from atom_aot.distributed import group
    from atom_aot.runtime.execution import cuda_graphs
    from atom_aot.runtime.parallel import tp_lead
    events = []

    class CapturedGraph:
        def reset(self):
            events.append("graph freed")
    graph = CapturedGraph()
    cuda_graphs._captured.add(graph)
    monkeypatch.setattr(group.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(group.dist, "destroy_process_group", lambda: events.append("left the group"))
    lead = tp_lead.LeadRank.__new__(tp_lead.LeadRank)
    lead._closing, lead.failure, lead.children = False, "rank 1 exited", []     # no stop message to send
    lead.close()
    assert events == ["graph freed", "left the group"]
    assert not list(cuda_graphs._captured)


FAILING_START = """
import json, sys, time
from atom_aot import LLMEngine
from atom_aot.runtime import assembly
def fail_on_rank_0(*args, **kwargs):
    raise RuntimeError("rank 0 could not start its engine core")
assembly.start_engine_core = fail_on_rank_0     # rank 1 (another process) goes on with its start
start = time.monotonic()
try:
    LLMEngine(sys.argv[1], num_kv_blocks=64, num_threads=1)
except RuntimeError as e:
    import torch.distributed as dist
    print(json.dumps({"error": str(e), "seconds": time.monotonic() - start, "left_group": not dist.is_initialized()}))
"""


def test_a_start_that_fails_on_rank_0_ends_with_its_error_while_the_other_rank_is_still_starting(build_artifact,
                                                                                                 tiny_llama_dir):
    """Rank 1 is then agreeing on the KV cache, not waiting for a step: telling it to stop would meet that
    collective and wait forever (as it did on GPUs). Its process is ended instead."""
    import json
    import subprocess
    import sys
    art = build_artifact(tiny_llama_dir, compile="none", tensor_parallel_size=2)
    out = subprocess.run([sys.executable, "-c", FAILING_START, str(art)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["error"] == "rank 0 could not start its engine core" and result["left_group"]
    assert result["seconds"] < 60


DYING_RANK = """
import json, subprocess, sys, time
from atom_aot import LLMEngine
from atom_aot.runtime.parallel import tp_lead
tp_lead.start_rank = lambda *args: subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
start = time.monotonic()
try:
    LLMEngine(sys.argv[1], num_kv_blocks=64, num_threads=1)
except tp_lead.RankFailure as e:
    import torch.distributed as dist
    print(json.dumps({"error": str(e), "seconds": time.monotonic() - start, "left_group": not dist.is_initialized()}))
"""


def test_a_rank_that_dies_before_it_joins_ends_the_start_at_once_naming_it(build_artifact, tiny_llama_dir):
    """Rank 0 used to wait for it until the rendezvous timeout (300 s), naming nobody."""
    import json
    import subprocess
    import sys
    art = build_artifact(tiny_llama_dir, compile="none", tensor_parallel_size=2)
    out = subprocess.run([sys.executable, "-c", DYING_RANK, str(art)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert re.fullmatch(r"tensor-parallel rank 1 \(pid \d+\) exited with code 3 before it joined the others: .*",
                        result["error"]), result
    assert result["seconds"] < 60 and result["left_group"]


def test_the_ranks_started_here_count_themselves_in_and_others_meet_as_torchrun_placed_them():
    place = RankPlace.local_leader(2)
    started = place.peer(1, started_by_leader=True)
    assert started.started_by_leader and started.environment()["ATOM_STARTED_BY_LEADER"] == "1"
    for other in (place, place.peer(1)):        # rank 0 itself; a data-parallel rank the server places
        assert not other.started_by_leader and "ATOM_STARTED_BY_LEADER" not in other.environment()


def test_a_closed_engine_gives_its_memory_back_says_it_is_closed_and_closes_once(build_artifact, tiny_llama_dir):
    engine = LLMEngine(str(build_artifact(tiny_llama_dir, compile="none")), **ENGINE)
    engine.generate(PROMPTS[:1], GREEDY)
    engine.close()
    assert engine.loaded is None
    with pytest.raises(RuntimeError, match="this engine is closed"):
        engine.generate(PROMPTS[:1], GREEDY)
    engine.close()


def test_a_killed_rank_ends_the_engine_with_an_error_naming_it(build_artifact, tiny_llama_dir):
    engine = LLMEngine(str(build_artifact(tiny_llama_dir, compile="none", tensor_parallel_size=2)), **ENGINE)
    worker = engine.core.runner.forwards.mixed.lead.children[0]
    worker.kill()
    worker.wait()
    start = time.monotonic()
    with pytest.raises(RankFailure, match=r"tensor-parallel rank 1 \(pid \d+\) exited with code -9"):
        engine.generate(PROMPTS, GREEDY)
    assert time.monotonic() - start < 10
    engine.close()


def test_a_killed_rank_ends_the_server_with_an_error_naming_it(build_artifact, tiny_llama_dir, tmp_path):
    from test_server_support import ServerProcess
    from atom_aot.server.lifecycle.shutdown import EXIT_ENGINE_DIED
    server = ServerProcess(build_artifact(tiny_llama_dir, compile="none", tensor_parallel_size=2), tmp_path,
                           api_key=None).wait_healthy()
    try:
        engine = server.engine_pid()
        children = Path(f"/proc/{engine}/task/{engine}/children").read_text().split()
        worker = next(int(pid) for pid in children if b"worker" in Path(f"/proc/{pid}/cmdline").read_bytes())
        os.kill(worker, signal.SIGKILL)
        killed = time.monotonic()
        assert server.proc.wait(30) == EXIT_ENGINE_DIED
        assert time.monotonic() - killed < 30
        assert re.search(r"tensor-parallel rank 1 \(pid \d+\) exited with code -9", server.log())
    finally:
        server.stop()


class TestRankPlace:
    def test_torchrun_variables_place_the_rank_and_meet_through_env(self, monkeypatch):
        for name, value in dict(MASTER_ADDR="10.0.0.1", MASTER_PORT="29500", WORLD_SIZE="4", RANK="3",
                                LOCAL_RANK="1").items():
            monkeypatch.setenv(name, value)
        place = RankPlace.from_env()
        assert (place.rank, place.world_size, place.local_rank, place.init_method) == (3, 4, 1, "env://")

    def test_a_partial_set_of_variables_is_refused_naming_the_missing_ones(self, monkeypatch):
        monkeypatch.setenv("RANK", "1")
        for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE"):
            monkeypatch.delenv(name, raising=False)
        with pytest.raises(ValueError, match="RANK set but not MASTER_ADDR, MASTER_PORT, WORLD_SIZE"):
            RankPlace.from_env()

    def test_ranks_started_here_meet_on_a_local_tcp_store(self):
        place = RankPlace.local_leader(2)
        assert place.init_method == f"tcp://127.0.0.1:{place.master_port}" and place.peer(1).rank == 1
