"""Sends the bad-input table (bad_input_cases.py) to a running server, one case at a time, while a
small request ("canary") runs beside each, and records what every user would see: the case's status
and error code, the canary's latency meanwhile, and whether the server still answers afterwards.
Two load cases follow: /health latency while large prompts are tokenized, and a small request's
time to first token while a prompt near the context length prefills.

    atom-run ART serve --port 8000 &
    python -m atom_aot.bench.bad_input --url http://127.0.0.1:8000 --out docs/benchmarks/FILE.json

$OPENAI_API_KEY, where set, is sent as the bearer token (a server started with --api-key).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from atom_aot.bench.bad_input_cases import CASES, Case
from atom_aot.bench.request import auth_headers

CANARY = {"prompt": "Hi", "max_tokens": 4, "temperature": 0}


class Canary:
    """Small completions back to back on a thread of their own; latencies are kept per window."""

    def __init__(self, url: str, model: str, timeout: float):
        self.client = httpx.Client(base_url=url, timeout=timeout, headers=auth_headers())
        self.model = model
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def once(self) -> tuple[float, int]:
        start = time.perf_counter()
        try:
            status = self.client.post("/v1/completions", json={"model": self.model, **CANARY}).status_code
        except httpx.HTTPError:
            status = 0
        return time.perf_counter() - start, status

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.once())

    def __enter__(self) -> "Canary":
        self.samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict:
        latencies = [s for s, _ in self.samples]
        return {"count": len(latencies), "failed": sum(1 for _, code in self.samples if code != 200),
                "median_s": round(statistics.median(latencies), 4) if latencies else None,
                "max_s": round(max(latencies), 4) if latencies else None}


def error_code(response: httpx.Response) -> tuple[str | None, str]:
    try:
        error = response.json().get("error") or {}
    except (ValueError, AttributeError):
        return None, response.text[:200]
    return error.get("code"), str(error.get("message", ""))[:200]


def run_case(client: httpx.Client, canary: Canary, case: Case) -> dict:
    body = case.body(canary.model)
    with canary:
        start = time.perf_counter()
        try:
            response = client.post(case.path, content=body, headers=case.headers)
            status, (code, message) = response.status_code, error_code(response)
        except httpx.HTTPError as e:
            status, code, message = 0, None, f"{type(e).__name__}: {e}"[:200]
        elapsed = time.perf_counter() - start
    alive_latency, alive_status = canary.once()
    return {"case": case.name, "why": case.why, "request_bytes": len(body), "status": status, "code": code,
            "message": message, "elapsed_s": round(elapsed, 4), "canary_during": canary.summary(),
            "alive_after": alive_status == 200, "canary_after_s": round(alive_latency, 4)}


def health_during_large_prompts(client: httpx.Client, model: str, count: int, megabytes: float) -> dict:
    """/health polled every 20 ms while `count` prompts of `megabytes` each are sent at once."""
    prompt = "word " * int(megabytes * (1 << 20) / 5)
    body = {"model": model, "prompt": prompt, "max_tokens": 1}
    latencies: list[float] = []
    with ThreadPoolExecutor(count) as pool:
        start = time.perf_counter()
        futures = [pool.submit(client.post, "/v1/completions", json=body) for _ in range(count)]
        while not all(f.done() for f in futures):
            t = time.perf_counter()
            client.get("/health")
            latencies.append(time.perf_counter() - t)
            time.sleep(0.02)
        statuses = [f.result().status_code for f in futures]
    return {"prompts": count, "prompt_mb": megabytes, "statuses": sorted(set(statuses)),
            "all_answered_s": round(time.perf_counter() - start, 3), "health_polls": len(latencies),
            "health_median_s": round(statistics.median(latencies), 4) if latencies else None,
            "health_max_s": round(max(latencies), 4) if latencies else None}


def long_prompt_interference(client: httpx.Client, canary: Canary, tokens: int) -> dict:
    """A small request's latency while one prompt of about `tokens` tokens prefills."""
    unit = " the"
    per_unit = client.post("/tokenize", json={"model": canary.model, "prompt": unit * 100}).json()["count"] / 100
    body = {"model": canary.model, "prompt": unit * int(tokens / per_unit), "max_tokens": 1}
    with canary:
        start = time.perf_counter()
        response = client.post("/v1/completions", json=body)
        elapsed = time.perf_counter() - start
    usage = response.json().get("usage", {}) if response.status_code == 200 else {}
    return {"prompt_tokens": usage.get("prompt_tokens"), "status": response.status_code,
            "long_prompt_s": round(elapsed, 3), "canary_during": canary.summary()}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m atom_aot.bench.bad_input", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="default: the first id of /v1/models")
    p.add_argument("--cases", default="", help="only the cases whose name contains this text")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one request may take")
    p.add_argument("--large-prompts", type=int, default=8, help="prompts sent at once for the /health case (0: skip)")
    p.add_argument("--large-prompt-mb", type=float, default=3.9)
    p.add_argument("--long-prompt-tokens", type=int, default=8000, help="0: skip the long-prompt case")
    p.add_argument("--out", default=None, help="JSON file for the results (default: stdout only)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client = httpx.Client(base_url=args.url, timeout=args.timeout, headers=auth_headers())
    model = args.model or client.get("/v1/models").json()["data"][0]["id"]
    canary = Canary(args.url, model, args.timeout)
    baseline = [canary.once()[0] for _ in range(5)]
    result = {"url": args.url, "model": model, "date": time.strftime("%Y-%m-%d"),
              "host": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "command": "python -m atom_aot.bench.bad_input " + " ".join(sys.argv[1:] if argv is None else argv),
              "canary_alone_median_s": round(statistics.median(baseline), 4), "cases": []}
    for case in (c for c in CASES if args.cases in c.name):
        row = run_case(client, canary, case)
        print(json.dumps(row), flush=True)
        result["cases"].append(row)
    if canary.once()[1] != 200:
        result["server_down"] = "the server stopped answering; the load cases were not run"
        print(result["server_down"], flush=True)
    elif args.large_prompts:
        result["health_during_large_prompts"] = health_during_large_prompts(
            client, model, args.large_prompts, args.large_prompt_mb)
        print(json.dumps(result["health_during_large_prompts"]), flush=True)
    if args.long_prompt_tokens and "server_down" not in result:
        result["long_prompt"] = long_prompt_interference(client, canary, args.long_prompt_tokens)
        print(json.dumps(result["long_prompt"]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    healthy = "server_down" not in result
    return 0 if healthy and all(row["alive_after"] and row["status"] != 500 for row in result["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
