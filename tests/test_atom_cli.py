"""ATOM's command lines run as written: `atom-run serve --model M` (and
`python -m atom_aot.entrypoints.openai_server`) builds or reuses the model's artifact and serves
it; ATOM's flag spellings; the served model name; ATOM's profiler variables."""
from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import time

import httpx
import pytest
from test_server_support import free_port

from atom_aot.entrypoints import openai_server, run_cli
from atom_aot.runtime.profiler import ProfilerError
from atom_aot.server import args as server_args


def test_atom_spellings_parse_to_the_same_options():
    args = openai_server.parse_args(["--model", "m", "--kv_cache_dtype", "fp8", "-tp", "8", "--server-port", "9001",
                                     "--max_model_len", "256", "--block_size", "32", "--max_num_seqs", "4"])
    assert (args.kv_cache_dtype, args.tensor_parallel_size, args.port) == ("fp8", 8, 9001)
    assert (args.max_model_len, args.block_size, args.max_num_seqs) == (256, 32, 4)
    assert openai_server.build_flags(args) == {"kv_cache_dtype": "fp8", "tensor_parallel_size": 8, "block_size": 32}


def test_dp_with_ep_builds_data_parallel_attention_and_without_it_replicates():
    dp_ep = openai_server.parse_args(["--model", "m", "-dp", "2", "--ep"])
    assert openai_server.build_flags(dp_ep) == {"enable_expert_parallel": True, "data_parallel_size": 2}
    replicas = openai_server.parse_args(["--model", "m", "-dp", "2"])
    assert openai_server.build_flags(replicas) == {} and replicas.data_parallel_size == 2
    tp_ep = openai_server.parse_args(["--model", "m", "-dp", "2", "--ep", "-tp", "2"])
    assert "data_parallel_size" not in openai_server.build_flags(tp_ep)


def test_server_port_is_an_alias_of_port_on_the_artifact_path_too():
    assert server_args.parse_args(["a.atom", "--server-port", "8123"]).port == 8123
    assert server_args.parse_args(["a.atom"]).model is None


class _Manifest:
    class model:
        name = "recorded-name"


@pytest.mark.parametrize("argv, expected", [
    (["--model", "./models/Qwen3-0.6B/"], "./models/Qwen3-0.6B/"),
    (["--model", "./m", "--served-model-name", "alias"], "alias"),
    ([], "recorded-name"),
])
def test_served_model_name_is_the_model_as_given(argv, expected):
    assert server_args.served_model_name(openai_server.parse_args(argv), _Manifest) == expected


def test_artifact_served_name_defaults_to_the_recorded_one():
    assert server_args.served_model_name(server_args.parse_args(["a.atom"]), _Manifest) == "recorded-name"


def test_atom_run_serve_without_an_artifact_is_the_model_entry(monkeypatch):
    seen = []
    monkeypatch.setattr(openai_server, "main", lambda argv: seen.append(argv) or 0)
    assert run_cli.main(["serve", "--model", "m", "--server-port", "1"]) == 0
    assert seen == [["--model", "m", "--server-port", "1"]]


def test_profiler_dir_defaults_to_atom_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("ATOM_TORCH_PROFILER_DIR", str(tmp_path))
    assert server_args.parse_args(["a.atom"]).torch_profiler_dir == str(tmp_path)
    assert openai_server.parse_args([]).torch_profiler_dir == str(tmp_path)


def test_tensor_parallel_stays_refused_by_the_build(tiny_llama_dir, capsys):
    assert openai_server.main(["--model", str(tiny_llama_dir), "-tp", "8", "--compile", "none"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "tensor" in err.lower() and "Traceback" not in err


def test_build_flags_with_an_artifact_are_refused(tiny_llama_eager_artifact, capsys):
    assert openai_server.main(["--model", str(tiny_llama_eager_artifact), "--kv_cache_dtype", "fp8"]) == 2
    assert "kv_cache_dtype: build options, fixed when" in capsys.readouterr().err


def test_serve_a_model_reuses_its_cached_build_and_serves_it(tiny_llama_dir, tiny_llama_eager_artifact, tmp_path):
    """The eager artifact of this model is already in the test run's cache: found by its build key."""
    port = free_port()
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "atom_aot.entrypoints.openai_server", "--model",
                                 str(tiny_llama_dir), "--compile", "none", "--server-port", str(port),
                                 "--num-kv-blocks", "64", "--max_num_seqs", "4"],
                                stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}", log_path)
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == str(tiny_llama_dir)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    text = log_path.read_text()
    assert f"JIT path: reused the cached artifact {tiny_llama_eager_artifact}" in text, text


def _wait_healthy(proc, url: str, log_path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}):\n{log_path.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise TimeoutError(log_path.read_text())


def test_llm_engine_profiles_into_gzipped_rank_traces(tiny_llama_eager_artifact, tmp_path, monkeypatch):
    from atom_aot import LLMEngine, SamplingParams
    monkeypatch.setenv("ATOM_TORCH_PROFILER_DIR", str(tmp_path))
    engine = LLMEngine(str(tiny_llama_eager_artifact), num_kv_blocks=64)
    assert engine.start_profile() == str(tmp_path / "rank_0")
    engine.generate(["profile me"], SamplingParams(max_tokens=2))
    trace = tmp_path / "rank_0" / os.path.basename(engine.stop_profile())
    assert trace.name.endswith(".json.gz") and "traceEvents" in json.loads(gzip.decompress(trace.read_bytes()))
    with pytest.raises(ProfilerError, match=r"start_profile\(\) first"):
        engine.stop_profile()


def test_llm_engine_without_a_profiler_dir_says_how_to_enable(tiny_llama_eager_artifact, monkeypatch):
    from atom_aot import LLMEngine
    monkeypatch.delenv("ATOM_TORCH_PROFILER_DIR", raising=False)
    engine = LLMEngine(str(tiny_llama_eager_artifact), num_kv_blocks=64)
    with pytest.raises(ProfilerError, match="torch_profiler_dir=DIR"):
        engine.start_profile()


# -- ATOM's engine flags, read onto ours (atom_aot/entrypoints/atom_flags.py) -----------------------------

@pytest.mark.parametrize("argv, expected", [
    (["--level", "0"], {"enforce_eager": True, "compile": "none"}),
    (["--level", "3"], {"enforce_eager": False, "compile": "aoti"}),
    (["--cudagraph-capture-sizes", "[1,2,4,8,16,32,48,64,128,256,512]"],
     {"capture_sizes": (1, 2, 4, 8, 16, 32, 48, 64, 128, 256, 512)}),
    (["--cudagraph-capture-sizes", "[]"], {"capture_sizes": ()}),
    (["--cudagraph-mode", "NONE"], {"capture_sizes": ()}),
    (["--cudagraph-mode", "FULL", "--cudagraph-capture-sizes", "[4, 1, 2]"], {"capture_sizes": (1, 2, 4)}),
    (["--load_dummy"], {"load_format": "dummy"}),
    (["--enable_prefix_caching"], {"enable_prefix_caching": True}),
    (["--no-enable_prefix_caching"], {"enable_prefix_caching": False}),
    (["--no-enable-prefix-caching"], {"enable_prefix_caching": False}),
    ([], {"enable_prefix_caching": True, "capture_sizes": None, "load_format": "auto"}),
    (["--enable_chunked_prefill", "--long-prefill-token-threshold", "0"], {"enable_chunked_prefill": True}),
])
def test_atom_engine_flags_map_onto_ours(argv, expected):
    args = openai_server.parse_args(["--model", "./m", *argv], atom_entry=True)
    assert {name: getattr(args, name) for name in expected} == expected


def test_mapped_atom_flags_reach_the_build():
    args = openai_server.parse_args(["--model", "./m", "--level", "0", "--load_dummy", "--cudagraph-capture-sizes",
                                     "[1,2]", "-dp", "2", "--enable-expert-parallel", "--enable-dp-attention"])
    assert openai_server.build_flags(args) == {"compile": "none", "load_format": "dummy", "capture_sizes": (1, 2),
                                               "enable_expert_parallel": True, "data_parallel_size": 2}


def test_level_0_with_an_artifact_runs_it_eagerly_without_a_build_option():
    args = openai_server.parse_args(["--model", "served.atom", "--level", "0"])
    assert args.enforce_eager and openai_server.build_flags(args) == {}


@pytest.mark.parametrize("argv, named", [
    (["--mark-trace"], "--mark-trace: .* use --torch-profiler-dir DIR"),
    (["--level", "1"], "--level 1: atom-aot compiles the whole graph ahead of time .level 3.* or not at all "
                       ".--level 0."),
    (["--level", "2"], "--level 2:"),
    (["--level", "3", "--compile", "none"], "--level 3 with --compile none"),
    (["--cudagraph-mode", "PIECEWISE"], "--cudagraph-mode PIECEWISE: .* no pieces"),
    (["--cudagraph-mode", "FULL_AND_PIECEWISE"], "--cudagraph-mode FULL_AND_PIECEWISE:"),
    (["--cudagraph-mode", "NONE", "--cudagraph-capture-sizes", "[1]"], "--cudagraph-mode NONE with"),
    (["--cudagraph-capture-sizes", "[1, x]"], "--cudagraph-capture-sizes must be a list"),
    (["--cudagraph-capture-sizes", "[0, 2]"], "--cudagraph-capture-sizes must be a list"),
    (["--cudagraph-capture-sizes", "[1,2]", "--capture-sizes", "1,4"], "disagree"),
    (["--no-enable_chunked_prefill"], "--no-enable_chunked_prefill: .*--max-num-batched-tokens"),
    (["--long-prefill-token-threshold", "512"], "--long-prefill-token-threshold 512:"),
    (["--index-cache-dtype", "fp8"], "--index-cache-dtype fp8:"),
    (["--enable-dp-attention"], "--enable-dp-attention: .*-dp N --enable-expert-parallel"),
    (["--enable-dp-attention", "-dp", "2"], "--enable-dp-attention: .*no --enable-expert-parallel"),
    (["--port", "9000"], "--port 9000: in ATOM this is the engine's internal port.* --server-port"),
])
def test_atom_flags_we_cannot_honour_are_refused_by_name(argv, named, capsys):
    with pytest.raises(SystemExit) as exit_:
        openai_server.parse_args(["--model", "./m", *argv], atom_entry=True)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and re.search(named, err), err
    assert "usage:" not in err and "Traceback" not in err


def test_trust_remote_code_is_accepted_and_said_to_run_no_code(caplog):
    from atom_aot.entrypoints.atom_flags import announce
    args = openai_server.parse_args(["--model", "./m", "--trust-remote-code"], atom_entry=True)
    with caplog.at_level("INFO", logger="atom_aot"):
        announce(args)
    assert "--trust-remote-code: no code from the model's repository is run" in caplog.text


def test_the_atom_entry_follows_atoms_server_and_atom_run_serve_vllms():
    atom = openai_server.parse_args(["--model", "./m", "--server-port", "9001", "--port", "8006"], atom_entry=True)
    assert (atom.port, atom.engine_port, atom.host, atom.default_completion_max_tokens) == (9001, 8006, "0.0.0.0", 256)
    vllm = openai_server.parse_args(["--model", "./m", "--port", "9001"])
    assert (vllm.port, vllm.host, vllm.default_completion_max_tokens) == (9001, "127.0.0.1", 16)
    assert not hasattr(vllm, "engine_port")


def test_completions_max_tokens_default_is_the_servers_option():
    from types import SimpleNamespace
    from atom_aot.server.options import ServerOptions
    from atom_aot.server.serving.completions import _max_tokens
    state = SimpleNamespace(options=ServerOptions(default_completion_max_tokens=256),
                            info=SimpleNamespace(max_model_len=1000))
    assert _max_tokens(state, SimpleNamespace(max_tokens=None), 10) == 256
    assert _max_tokens(state, SimpleNamespace(max_tokens=None), 900) == 100       # what fits the context
    assert _max_tokens(state, SimpleNamespace(max_tokens=7), 10) == 7


# -- the examples take ATOM's EngineArgs (atom_aot/entrypoints/engine_args.py) ----------------------------

@pytest.mark.parametrize("example", ["simple_inference", "profile_offline"])
def test_the_examples_take_the_engine_flags_atoms_take(example):
    import importlib
    from atom_aot.entrypoints.engine_args import engine_options
    module = importlib.import_module(f"atom_aot.examples.{example}")
    args = module.parse_args(["--model", "./m", "--kv_cache_dtype", "fp8", "-tp", "2", "--level", "0",
                              "--max_num_seqs", "8", "--block-size", "32", "--no-enable_prefix_caching"])
    options = engine_options(args)
    assert {k: options[k] for k in ("kv_cache_dtype", "tensor_parallel_size", "block_size", "compile")} == \
        {"kv_cache_dtype": "fp8", "tensor_parallel_size": 2, "block_size": 32, "compile": "none"}
    assert (options["enforce_eager"], options["max_num_seqs"], options["enable_prefix_caching"]) == (True, 8, False)


def test_simple_inference_passes_its_flags_to_the_engine(tiny_llama_eager_artifact, capsys):
    from atom_aot.examples import simple_inference
    assert simple_inference.main(["--model", str(tiny_llama_eager_artifact), "--kv_cache_dtype", "fp8"]) == 2
    assert "kv_cache_dtype: build options, fixed when" in capsys.readouterr().err
    assert simple_inference.main(["--model", str(tiny_llama_eager_artifact), "--max-tokens", "2", "--num-kv-blocks",
                                  "64", "--max_num_seqs", "2", "--no-enable-thinking", "hi", "there"]) == 0
    assert re.search(r"^2 prompts, \d+ tokens in ", capsys.readouterr().out, flags=re.M)


# -- profiling every rank ------------------------------------------------------------------------------

def test_a_tp2_engine_writes_a_trace_for_each_rank(build_artifact, tiny_llama_dir, tmp_path):
    from atom_aot import LLMEngine, SamplingParams
    art = build_artifact(tiny_llama_dir, compile="none", tensor_parallel_size=2)
    engine = LLMEngine(str(art), torch_profiler_dir=str(tmp_path), num_kv_blocks=64, num_threads=1)
    try:
        assert engine.start_profile() == str(tmp_path / "rank_0")
        engine.generate(["profile every rank"], SamplingParams(max_tokens=2))
        rank_0 = engine.stop_profile()
        engine.generate(["still serving after"], SamplingParams(max_tokens=2))
    finally:
        engine.close()
    for rank in (0, 1):
        (trace,) = (tmp_path / f"rank_{rank}").glob("*.json.gz")
        names = {e.get("name") for e in json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]}
        assert "atom::paged_attention" in names, f"rank {rank}"
    assert rank_0 == str(next((tmp_path / "rank_0").glob("*.json.gz")))


def test_each_data_parallel_engine_writes_under_its_own_ranks(tmp_path):
    """Replica i of an artifact of N ranks: rank_<i*N + r>; rank r of a data-parallel-attention artifact: rank_<r>."""
    import asyncio
    from types import SimpleNamespace
    from atom_aot.runtime.config import RuntimeConfig
    from atom_aot.runtime.profiler import TorchProfiler, TraceDir
    from atom_aot.runtime.processes.data_parallel import attention_dp_client
    from atom_aot.server.args import engine_client
    root = str(tmp_path)
    manifest = SimpleNamespace(layout=SimpleNamespace(attention_data_parallel=False, world_size=2),
                               target=SimpleNamespace(arch="cpu"))
    args = SimpleNamespace(artifact="a.atom", data_parallel_size=3, dp_routing=None, torch_profiler_dir=root,
                           log_level="info")
    replicas = engine_client(args, RuntimeConfig(), manifest)
    ranks = attention_dp_client("a.atom", RuntimeConfig(), 2, root, "info")
    off = attention_dp_client("a.atom", RuntimeConfig(), 2, None, "info")
    try:
        assert [r.profiler_dir for r in replicas.replicas] == [TraceDir(root, 0), TraceDir(root, 2), TraceDir(root, 4)]
        assert [r.profiler_dir for r in ranks.replicas] == [TraceDir(root, 0), TraceDir(root, 1)]
        assert [r.profiler_dir for r in off.replicas] == [None, None]
    finally:
        for client in (replicas, ranks, off):
            asyncio.run(client.shutdown())
    assert TorchProfiler(TraceDir(root, 2)).out_dir == tmp_path / "rank_2"           # replica 1's engine (rank 0)
    assert TorchProfiler(TraceDir(root, 2), rank=1).out_dir == tmp_path / "rank_3"   # and its rank 1
    assert TorchProfiler(root).out_dir == tmp_path / "rank_0"
