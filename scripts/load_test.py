"""Load test: thousands of concurrent requests, client disconnects mixed in, against one server.

  python scripts/load_test.py --artifact ART [--requests 2000] [--concurrency 256] [--out result.json]
  python scripts/load_test.py --url http://127.0.0.1:8000 ...      # a server that is already running

With --artifact it starts `python -m atom_aot.server ART` on a free 127.0.0.1 port (extra flags
through --server-args) and stops it with SIGTERM at the end, checking that it exits 0. Requests
mix completions and chat, whole and streamed, `--concurrency` at a time; every
`--disconnect-every`-th one hangs up early (a stream after its first event, a whole request after
a few milliseconds). Meanwhile /health is polled every 0.1 s from another process. The result (JSON, printed and
optionally written): requests/s and latency percentiles of the completed requests, errors (a
non-200, an error event, a stream without [DONE], a transport failure), /health probes that were
not 200, and the free KV blocks before and after (once the engine is idle again). Exit status 0
when there were no errors, every probe was 200 and the KV blocks all came back.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx

WORDS = "the quick brown fox jumps over lazy dog paged attention blocks hello world engine tokens".split()
HEALTH_PERIOD_S = 0.1


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--artifact", help="start a server on this artifact")
    target.add_argument("--url", help="use the server at this URL")
    p.add_argument("--server-args", default="--num-kv-blocks 1024", help="extra flags for the started server")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--disconnect-every", type=int, default=10, help="every k-th request hangs up early (0: none)")
    p.add_argument("--max-tokens", type=int, default=24, help="largest max_tokens of a request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the JSON result here")
    return p.parse_args(argv)


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)     # seconds, of requests that completed
    disconnected: int = 0
    errors: list[str] = field(default_factory=list)
    health_probes: int = 0
    health_failures: list[str] = field(default_factory=list)
    health_max_s: float = 0.0


# -- one request --------------------------------------------------------------------------------
def request_body(rng: random.Random, model: str, max_tokens: int) -> tuple[str, dict]:
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 32)))
    body = {"model": model, "max_tokens": rng.randint(1, max_tokens), "temperature": rng.choice([0.0, 0.8]),
            "stream": rng.random() < 0.5}
    if rng.random() < 0.5:
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": text}]}
    return "/v1/completions", {**body, "prompt": text}


async def one_request(client: httpx.AsyncClient, path: str, body: dict, hang_up: bool, tally: Tally) -> None:
    start = time.perf_counter()
    try:
        if body["stream"]:
            done = await _stream(client, path, body, hang_up, tally)
        elif hang_up:
            done = await _hang_up_whole(client, path, body)
        else:
            response = await client.post(path, json=body)
            done = response.status_code == 200 or _error(tally, f"{response.status_code}: {response.text[:200]}")
    except httpx.HTTPError as e:
        done = _error(tally, f"{type(e).__name__}: {e}")
    if done and hang_up:
        tally.disconnected += 1
    elif done:
        tally.latencies.append(time.perf_counter() - start)


async def _stream(client: httpx.AsyncClient, path: str, body: dict, hang_up: bool, tally: Tally) -> bool:
    async with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            return _error(tally, f"{response.status_code}: {(await response.aread())[:200]!r}")
        events = []
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line)
            if hang_up:
                return True            # leaving the block closes the connection mid-stream
            if '"error"' in line:
                return _error(tally, line[:200])
    return events[-1:] == ["data: [DONE]"] or _error(tally, f"a stream ended without [DONE] ({len(events)} events)")


async def _hang_up_whole(client: httpx.AsyncClient, path: str, body: dict) -> bool:
    try:
        await asyncio.wait_for(client.post(path, json=body), timeout=0.02)
    except asyncio.TimeoutError:
        pass                           # cancelled: httpx closes the connection
    return True


def _error(tally: Tally, what: str) -> bool:
    tally.errors.append(what)
    return False


# -- the run ------------------------------------------------------------------------------------
def poll_health(url: str, stop, results) -> None:
    """In a process of its own, so that its timings are the server's, not this busy client's."""
    probes, failures, slowest = 0, [], 0.0
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                response = client.get("/health")
                if response.status_code != 200:
                    failures.append(f"{response.status_code}: {response.text[:200]}")
            except httpx.HTTPError as e:
                failures.append(f"{type(e).__name__}: {e}")
            slowest = max(slowest, time.perf_counter() - start)
            probes += 1
            stop.wait(HEALTH_PERIOD_S)
    results.put((probes, failures, slowest))


async def run_load(url: str, args: argparse.Namespace, tally: Tally) -> float:
    """Send every request while /health is polled; returns the seconds the requests took."""
    spawn = multiprocessing.get_context("spawn")
    stop, results = spawn.Event(), spawn.Queue()
    prober = spawn.Process(target=poll_health, args=(url, stop, results), name="health-prober")
    prober.start()
    try:
        duration = await _send_all(url, args, tally)
    finally:
        stop.set()
        tally.health_probes, tally.health_failures, tally.health_max_s = results.get(timeout=60)
        prober.join(10)
    return duration


async def _send_all(url: str, args: argparse.Namespace, tally: Tally) -> float:
    limits = httpx.Limits(max_connections=args.concurrency + 8, max_keepalive_connections=args.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        rng, gate = random.Random(args.seed), asyncio.Semaphore(args.concurrency)

        async def gated(i: int, path: str, body: dict) -> None:
            async with gate:
                hang_up = args.disconnect_every > 0 and i % args.disconnect_every == args.disconnect_every - 1
                await one_request(client, path, body, hang_up, tally)

        start = time.perf_counter()
        await asyncio.gather(*(gated(i, *request_body(rng, model, args.max_tokens)) for i in range(args.requests)))
        return time.perf_counter() - start


def engine_numbers(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


def wait_idle(url: str, timeout: float = 60) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        numbers = engine_numbers(url)
        idle = numbers["atom_num_requests_running"] == 0 and numbers["atom_num_requests_waiting"] == 0
        if (idle and numbers["atom_kv_cache_blocks_free"] == numbers["atom_kv_cache_blocks_total"]) or \
                time.monotonic() > deadline:
            return numbers
        time.sleep(0.2)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def result_of(args, tally: Tally, duration: float, before: dict, after: dict) -> dict:
    total = len(tally.latencies) + tally.disconnected + len(tally.errors)
    return {
        "requests": args.requests, "concurrency": args.concurrency, "completed": len(tally.latencies),
        "disconnected": tally.disconnected, "errors": len(tally.errors), "error_samples": tally.errors[:5],
        "accounted": total == args.requests, "duration_s": round(duration, 3),
        "requests_per_s": round(args.requests / duration, 2),
        "latency_s": {f"p{q}": percentile(tally.latencies, q) for q in (50, 90, 99)} | {
            "max": max(tally.latencies, default=None)},
        "health": {"probes": tally.health_probes, "not_200": len(tally.health_failures),
                   "samples": tally.health_failures[:5], "max_latency_s": round(tally.health_max_s, 4)},
        "engine_alive": after.get("atom_engine_alive") == 1,
        "kv_blocks": {"total": after["atom_kv_cache_blocks_total"], "free_before": before["atom_kv_cache_blocks_free"],
                      "free_after": after["atom_kv_cache_blocks_free"]},
    }


# -- the server ---------------------------------------------------------------------------------
def start_server(artifact: str, server_args: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "atom_aot.server", artifact, "--port", str(port),
                             "--log-level", "warning", *shlex.split(server_args)], env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with status {proc.returncode} before it was healthy")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    proc.kill()
    raise SystemExit("the server was not healthy after 300s")


def stop_server(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return -9


def main(argv=None) -> int:
    args = parse_args(argv)
    proc, url = start_server(args.artifact, args.server_args) if args.artifact else (None, args.url.rstrip("/"))
    try:
        before = wait_idle(url)
        tally = Tally()
        duration = asyncio.run(run_load(url, args, tally))
        result = result_of(args, tally, duration, before, wait_idle(url))
    finally:
        status = stop_server(proc) if proc is not None else None
    result["server_exit_status"] = status
    result["ok"] = (result["errors"] == 0 and result["accounted"] and result["health"]["not_200"] == 0
                    and result["engine_alive"] and result["kv_blocks"]["free_after"] == result["kv_blocks"]["total"]
                    and status in (0, None))
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
