"""How much one long prompt holds back the other requests: a small request's time to first token while
a prompt near the context length prefills, the long prompt's own time alone and beside it, and a small
request's time to first token after the long prompt's client went away mid-prefill.

It starts `python -m atom_aot.server ART` itself (the flags after `--` go to the server), so the one
command in the JSON says everything that was measured:

    python -m atom_aot.bench.long_prompt --artifact artifacts/smollm2.atom --out FILE.json -- --num-threads 2

Prompts are random token ids (a new seed each time, so no prefix-cache hit shortens a later one), sent as
token ids to /v1/completions with streaming; times are the client's.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from atom_aot.bench.gpu.serve import wait_until_up
from atom_aot.bench.request import auth_headers


@dataclass(frozen=True)
class Timed:
    """One streamed request as its client saw it (seconds from sending it)."""
    ttft: float | None       # the first chunk that carried output; None: none came (cancelled, or failed)
    total: float
    status: int


def stream(url: str, body: dict, timeout: float, give_up_after: float | None = None) -> Timed:
    """Send a streamed completion and read it to the end, or close the connection after `give_up_after`
    seconds (a client that goes away)."""
    start, ttft = time.perf_counter(), None
    with httpx.Client(base_url=url, timeout=timeout, headers=auth_headers()) as client:
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
            if give_up_after is not None:
                time.sleep(give_up_after)
                return Timed(None, time.perf_counter() - start, response.status_code)
            for line in response.iter_lines():
                if ttft is None and line.startswith("data:") and '"text"' in line:
                    ttft = time.perf_counter() - start
    return Timed(ttft, time.perf_counter() - start, response.status_code)


class Bench:
    def __init__(self, url: str, model: str, max_token_id: int, timeout: float, seed: int):
        self.url, self.model, self.max_token_id, self.timeout = url, model, max_token_id, timeout
        self.rng = random.Random(seed)

    def body(self, num_tokens: int, max_tokens: int) -> dict:
        ids = [self.rng.randrange(1000, self.max_token_id) for _ in range(num_tokens)]
        return {"model": self.model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}

    def alone(self, num_tokens: int, max_tokens: int) -> Timed:
        return stream(self.url, self.body(num_tokens, max_tokens), self.timeout)

    def beside(self, long_tokens: int, short_tokens: int, short_max_tokens: int, delay: float,
               give_up_after: float | None = None) -> dict:
        """The long prompt (its client closing after `give_up_after` s, if given), then after `delay` s a short one."""
        long_body, results = self.body(long_tokens, 1), {}
        thread = threading.Thread(target=lambda: results.update(
            long=stream(self.url, long_body, self.timeout, give_up_after)))
        thread.start()
        time.sleep(delay)
        short = self.alone(short_tokens, short_max_tokens)
        thread.join()
        return {"short": asdict(short), "long": asdict(results["long"])}


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "all": [round(v, 3) for v in values]}


def start_server(artifact: str, port: int, serve_args: list[str], log_path: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "atom_aot.server", artifact, "--port", str(port), *serve_args]
    log = open(log_path, "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = sys.argv[1:] if argv is None else list(argv)
    ours, serve_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(prog="python -m atom_aot.bench.long_prompt", description=__doc__.split("\n\n")[0])
    p.add_argument("--artifact", required=True)
    p.add_argument("--out", default=None, help="JSON file for the results (default: stdout only)")
    p.add_argument("--long-tokens", type=int, default=8000)
    p.add_argument("--short-tokens", type=int, default=16)
    p.add_argument("--short-max-tokens", type=int, default=8)
    p.add_argument("--delay", type=float, default=2.0, help="seconds between the long prompt and the short one")
    p.add_argument("--repeat", type=int, default=2, help="times each case runs")
    p.add_argument("--cases", default="alone,beside,disconnect", help="which of alone, beside, disconnect to run")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one request may take")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-token-id", type=int, default=32000, help="prompt ids are drawn from [1000, this)")
    p.add_argument("--label", default="", help="free text stored with the results (what code ran)")
    args = p.parse_args(ours)
    if args.max_token_id <= 1000:
        p.error(f"--max-token-id must be above 1000 (prompt ids are drawn from [1000, it)), got {args.max_token_id}")
    return args, serve_args


def run_cases(bench: Bench, args: argparse.Namespace) -> dict:
    cases, result = args.cases.split(","), {}
    result["short_alone_ttft_s"] = spread([bench.alone(args.short_tokens, args.short_max_tokens).ttft
                                           for _ in range(3)])
    if "alone" in cases:
        result["long_alone_s"] = spread([bench.alone(args.long_tokens, 1).total for _ in range(args.repeat)])
    if "beside" in cases:
        runs = [bench.beside(args.long_tokens, args.short_tokens, args.short_max_tokens, args.delay)
                for _ in range(args.repeat)]
        result["beside"] = {"short_ttft_s": spread([r["short"]["ttft"] for r in runs]),
                            "long_total_s": spread([r["long"]["total"] for r in runs]), "runs": runs}
    if "disconnect" in cases:
        # the long prompt's client leaves at `delay`; the short one is sent a moment later
        runs = [bench.beside(args.long_tokens, args.short_tokens, args.short_max_tokens, args.delay + 0.5,
                             give_up_after=args.delay) for _ in range(args.repeat)]
        result["disconnect"] = {"short_ttft_s": spread([r["short"]["ttft"] for r in runs]), "runs": runs}
    return result


def main(argv: list[str] | None = None) -> int:
    args, serve_args = parse_args(argv)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = (args.out or "long_prompt") + ".server.log"
    server = start_server(args.artifact, port, serve_args, log_path)
    try:
        wait_until_up(server, port, Path(log_path), args.timeout)
        model = httpx.get(f"{url}/v1/models", headers=auth_headers()).json()["data"][0]["id"]
        result = {"artifact": args.artifact, "label": args.label, "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                       time.gmtime()),
                  "host": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                  "load_average_at_start": os.getloadavg(),
                  "command": "python -m atom_aot.bench.long_prompt " + " ".join(sys.argv[1:] if argv is None else argv),
                  "long_tokens": args.long_tokens, "short_tokens": args.short_tokens,
                  "short_max_tokens": args.short_max_tokens, "delay_s": args.delay}
        result.update(run_cases(Bench(url, model, args.max_token_id, args.timeout, args.seed), args))
        result["load_average_at_end"] = os.getloadavg()
    finally:
        server.terminate()
        server.wait(timeout=60)
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
