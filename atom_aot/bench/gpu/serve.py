"""The serving workload for either engine: its OpenAI-compatible server started on the scenario's artifact or
folder with the shared settings, then the same client (atom_aot.bench.serving, random prompts) against it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from atom_aot.bench.gpu.scenarios import GPU_MEMORY_UTILIZATION, MAX_NUM_SEQS, Scenario, engine_kwargs_vllm

PORT = {"ours": 8000, "vllm": 8001}
START_TIMEOUT_S = 600
CLIENT_TIMEOUT_S = 900
SHARED_FLAGS = ["--gpu-memory-utilization", str(GPU_MEMORY_UTILIZATION), "--max-num-seqs", str(MAX_NUM_SEQS)]


def as_flags(settings: dict) -> list[str]:
    """Python keyword settings as command-line flags: True -> --flag, dicts as JSON."""
    flags = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def server_command(which: str, s: Scenario, model: Path, artifact: Path | None) -> list[str]:
    port = str(PORT[which])
    if which == "ours":
        return [sys.executable, "-m", "atom_aot.entrypoints.run_cli", str(artifact), "serve", "--port", port,
                *SHARED_FLAGS, "--max-model-len", str(s.max_model_len), *as_flags(dict(s.ours_kwargs))]
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", port,
            "--seed", "0", *SHARED_FLAGS, "--max-model-len", str(s.max_model_len), *as_flags(engine_kwargs_vllm(s))]


def client_command(which: str, s: Scenario, model: Path, work: Path) -> list[str]:
    w = s.workload
    cmd = [sys.executable, "-m", "atom_aot.bench.serving", "--base-url", f"http://127.0.0.1:{PORT[which]}",
           "--backend", "vllm", "--tokenizer", str(model), "--dataset-name", "random",
           "--random-input-len", str(w.input_len), "--random-output-len", str(w.output_len),
           "--random-range-ratio", "1.0", "--random-prefix-len", str(w.prefix_len), "--num-prompts", str(w.num_prompts),
           "--ignore-eos", "--disable-tqdm", "--seed", "0", "--metric-percentiles", "50,90,99",
           "--save-result", "--result-dir", str(work), "--result-filename", f"{which}-serving.json"]
    if w.request_rate is not None:
        cmd += ["--request-rate", str(w.request_rate)]
    if w.max_concurrency is not None:
        cmd += ["--max-concurrency", str(w.max_concurrency)]
    return cmd


def wait_until_up(proc: subprocess.Popen, port: int, log: Path, timeout: float = START_TIMEOUT_S) -> float:
    """Seconds until the server on `port` answers (any status: one started with an API key answers 401)."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}) before it answered; its log ends:\n"
                               + log.read_text()[-3000:])
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
            return time.perf_counter() - start
        except urllib.error.HTTPError:
            return time.perf_counter() - start
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"the server did not answer within {timeout:.0f} s; its log ends:\n"
                       + log.read_text()[-3000:])


def stop(proc: subprocess.Popen) -> None:
    """SIGINT first (a clean shutdown), then the whole process group (the engines' worker processes too)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def serving(which: str, s: Scenario, model: Path, artifact: Path | None, work: Path) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    log = work / f"{which}-server.log"
    with open(log, "w") as log_file:
        proc = subprocess.Popen(server_command(which, s, model, artifact), stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        up_s = wait_until_up(proc, PORT[which], log)
        client = subprocess.run(client_command(which, s, model, work), capture_output=True, text=True,
                                timeout=CLIENT_TIMEOUT_S)
        if client.returncode:
            raise RuntimeError(f"the serving client failed ({client.returncode}):\n{client.stderr[-3000:]}")
    finally:
        stop(proc)
    figures = json.loads((work / f"{which}-serving.json").read_text())
    return {"server_up_s": up_s, "client": figures}
