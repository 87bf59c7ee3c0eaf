"""ATOM's command lines run as written: `atom-run serve --model M` (and
`python -m atom_aot.entrypoints.openai_server`) builds or reuses the model's artifact and serves
it; ATOM's flag spellings; the served model name; ATOM's profiler variables."""
from __future__ import annotations

import gzip
import json
import os
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
    """The eager artifact of this model is already in the session cache: found by its build key."""
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
