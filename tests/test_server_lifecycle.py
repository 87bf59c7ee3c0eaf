"""The server's process life: startup failures print one paragraph and exit 2; an engine that
dies turns generation and /health into 503 while the HTTP server stays up."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from test_server_support import ServerProcess, free_port, metric, runtime_flags


def _run_server(*args: str, port: int | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "atom_aot.server", *args, "--port", str(port or free_port())],
                          capture_output=True, text=True, timeout=120, env=os.environ.copy())


def test_missing_artifact_exits_2_with_a_message(tmp_path):
    result = _run_server(str(tmp_path / "nope.atom"))
    assert result.returncode == 2
    assert result.stderr.startswith("error: no artifact at") and "Traceback" not in result.stderr


def test_a_taken_port_fails_before_loading_the_model(tiny_llama_eager_artifact):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = _run_server(str(tiny_llama_eager_artifact), port=taken.getsockname()[1])
    assert result.returncode == 2 and "error: cannot listen on 127.0.0.1:" in result.stderr
    assert "engine ready" not in result.stderr


def test_engine_startup_error_is_reported_by_the_front_end(tiny_llama_eager_artifact):
    """The engine refuses a KV pool too small for one sequence; the front end prints why."""
    result = _run_server(str(tiny_llama_eager_artifact), *runtime_flags({"num_kv_blocks": 2}))
    assert result.returncode == 2, result.stderr
    assert "error: the KV cache holds 2 blocks" in result.stderr and "Traceback" not in result.stderr


def test_atom_run_serve_reaches_the_server_flags():
    result = subprocess.run([sys.executable, "-m", "atom_aot.entrypoints.run_cli", "some.atom", "serve", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "--torch-profiler-dir" in result.stdout and "--api-key" in result.stdout


@pytest.fixture
def doomed_server(tiny_llama_eager_artifact, tmp_path):
    proc = ServerProcess(tiny_llama_eager_artifact, tmp_path, api_key=None)
    try:
        yield proc.wait_healthy()
    finally:
        proc.stop()


def test_engine_death_gives_503_and_the_server_stays_up(doomed_server, tiny_llama_eager_artifact):
    from atom_aot.artifact.reader import Artifact
    server = doomed_server
    model = Artifact.open(tiny_llama_eager_artifact).manifest.model.name
    body = {"model": model, "prompt": "Hello", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        os.kill(server.engine_pid(), signal.SIGKILL)
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]" and '"engine_unavailable"' in rest[-2]

    deadline = time.monotonic() + 10
    while httpx.get(f"{server.url}/health").status_code != 503 and time.monotonic() < deadline:
        time.sleep(0.1)
    health = httpx.get(f"{server.url}/health")
    assert health.status_code == 503 and health.json()["error"]["code"] == "engine_unavailable"
    response = httpx.post(f"{server.url}/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2})
    assert response.status_code == 503 and set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert metric(httpx.get(f"{server.url}/metrics").text, "atom_engine_alive") == 0
    assert httpx.get(f"{server.url}/v1/models").status_code == 200
    assert server.proc.poll() is None
