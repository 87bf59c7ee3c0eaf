"""The server's process life: startup failures print one paragraph and exit 2; SIGTERM drains
and exits 0; an engine that dies ends in-flight requests with an error and the server with 3."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from test_server_support import ServerProcess, free_port, runtime_flags

from atom_aot.server.lifecycle.shutdown import EXIT_ENGINE_DIED


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


def test_max_model_len_above_the_artifacts_is_refused(tiny_llama_eager_artifact):
    """Issue case 11: no silent clamp."""
    result = _run_server(str(tiny_llama_eager_artifact), "--max-model-len", "100000")
    assert result.returncode == 2, result.stderr
    assert "--max-model-len 100000 is above this artifact's limit of 512" in result.stderr
    assert "engine ready" not in result.stderr


@pytest.fixture
def doomed_server(tiny_llama_eager_artifact, tmp_path):
    proc = ServerProcess(tiny_llama_eager_artifact, tmp_path, api_key=None)
    try:
        yield proc.wait_healthy()
    finally:
        proc.stop()


def _model(artifact) -> str:
    from atom_aot.artifact.reader import Artifact
    return Artifact.open(artifact).manifest.model.name


def _events(lines) -> list[str]:
    return [line for line in lines if line.startswith("data: ")]


def test_engine_death_ends_streams_with_an_error_and_the_server_exits_3(doomed_server, tiny_llama_eager_artifact):
    """Issue case 8: no zombie front end; a supervisor sees the exit and restarts the server."""
    server = doomed_server
    body = {"model": _model(tiny_llama_eager_artifact), "prompt": "Hello", "max_tokens": 400, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        os.kill(server.engine_pid(), signal.SIGKILL)
        killed = time.monotonic()
        rest = _events(lines)
    assert rest[-1] == "data: [DONE]" and '"engine_unavailable"' in rest[-2]
    assert server.proc.wait(15) == EXIT_ENGINE_DIED
    assert time.monotonic() - killed < 15
    assert "because its engine process exited" in server.log()


def _drain_server(artifact, tmp_path) -> ServerProcess:
    """One sequence at a time, so queued requests cannot all finish within the shutdown timeout."""
    return ServerProcess(artifact, tmp_path, "--max-num-seqs", "1", "--shutdown-timeout", "3", "--log-level", "info",
                         api_key=None)


def _wait_queued(server, count: int) -> None:
    deadline = time.monotonic() + 20
    while httpx.get(f"{server.url}/ready").json()["queued_seqs"] < count:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_sigterm_drains_then_answers_the_rest_and_exits_0(tiny_llama_eager_artifact, tmp_path):
    """Issue case 7: in-flight requests finish within --shutdown-timeout, the rest get OpenAI-shaped
    errors (a stream an error event and [DONE]), new ones 503; exit 0 and no engine left behind."""
    model = _model(tiny_llama_eager_artifact)
    short = {"model": model, "prompt": "Hello", "max_tokens": 300, "ignore_eos": True, "stream": True}
    long = {"model": model, "prompt": "Hello", "max_tokens": 480, "ignore_eos": True, "n": 16}
    with _drain_server(tiny_llama_eager_artifact, tmp_path) as server, ThreadPoolExecutor(3) as pool:
        engine = server.engine_pid()
        url = f"{server.url}/v1/completions"
        os.kill(engine, signal.SIGSTOP)        # everything below is in flight when SIGTERM comes
        try:
            finishing = pool.submit(lambda: httpx.post(url, json=short, timeout=60).text)
            _wait_queued(server, 1)
            cut_stream = pool.submit(lambda: httpx.post(url, json={**long, "stream": True}, timeout=60).text)
            _wait_queued(server, 17)
            cut_whole = pool.submit(lambda: httpx.post(url, json=long, timeout=60))
            _wait_queued(server, 33)
            server.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            refused = httpx.post(url, json={**short, "stream": False}, timeout=10)
            ready, health = httpx.get(f"{server.url}/ready"), httpx.get(f"{server.url}/health")
        finally:
            os.kill(engine, signal.SIGCONT)
        assert server.proc.wait(30) == 0
        finished, cut, whole = _events(finishing.result().splitlines()), cut_stream.result(), cut_whole.result()
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"
    assert ready.status_code == 503 and health.status_code == 200
    assert finished[-1] == "data: [DONE]" and '"finish_reason": "length"' in finished[-2]
    assert "error" not in "".join(finished)
    cut_events = _events(cut.splitlines())
    assert cut_events[-1] == "data: [DONE]" and '"server_shutting_down"' in cut_events[-2]
    assert whole.status_code == 503 and set(whole.json()["error"]) == {"message", "type", "param", "code"}
    assert whole.json()["error"]["code"] == "server_shutting_down"
    assert not Path(f"/proc/{engine}").exists()             # the engine stopped with the server
    log = server.log()
    assert "SIGTERM: draining" in log and "answered with an error" in log and "Traceback" not in log
    assert "torch threads: " in log                         # the engine says how many threads it took, and why
