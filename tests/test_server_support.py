"""Helpers for the server tests (no tests here): run `python -m atom_aot.server` as a subprocess
on a free port and wait until it answers /health."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

API_KEY = "sk-test-key"
# the engine config both the server and the offline reference use (RuntimeConfig field -> value)
RUNTIME = {"num_kv_blocks": 512}


def runtime_flags(runtime: dict) -> list[str]:
    return [arg for key, value in runtime.items() for arg in (f"--{key.replace('_', '-')}", str(value))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A live server; `url`, `proc`, and its log file."""

    def __init__(self, artifact: Path, log_dir: Path, *extra: str, api_key: str | None = API_KEY,
                 runtime: dict = RUNTIME):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log_path = log_dir / f"server-{self.port}.log"
        args = [sys.executable, "-m", "atom_aot.server", str(artifact), "--port", str(self.port),
                "--log-level", "warning", *runtime_flags(runtime), *extra]
        if api_key:
            args += ["--api-key", api_key]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=os.environ.copy())

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def wait_healthy(self, timeout: float = 120.0) -> "ServerProcess":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}):\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"the server was not healthy after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    def engine_pid(self) -> int:
        """The engine process: the server's spawned child (the multiprocessing `spawn_main` one)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        for pid in children:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
        raise RuntimeError("no engine process found")

    def __enter__(self) -> "ServerProcess":
        """Waits until healthy; the server stops when the block ends (even if it never got healthy)."""
        try:
            return self.wait_healthy()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGINT drains; a second one answers what is still running at once; then kill."""
        for signum, wait in ((signal.SIGINT, 15), (signal.SIGINT, 15), (signal.SIGKILL, 30)):
            if self.proc.poll() is not None:
                break
            self.proc.send_signal(signum)
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                pass
        self._log.close()


def metric(text: str, name: str) -> float:
    """The value of an unlabelled sample in Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return sample.value
    raise KeyError(name)
