"""The runtime's commands of `atom-run ART {generate,inspect,verify,worker}`: use an artifact, never compile.

`atom-run` itself (atom_aot/entrypoints/run_cli.py) adds `serve`; `python -m atom_aot.runtime.cli`
runs them alone.
"""
from __future__ import annotations

import argparse
import sys
import time

from atom_aot.config_flags import add_arguments, from_namespace
from atom_aot.logging_setup import seconds_listed
from atom_aot.runtime.config import RuntimeConfig


def parse_args(argv: list[str], commands: tuple[str, ...]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="atom-run", description="Serve or inspect an atom-aot artifact "
                                "(built by atom-build). Nothing is compiled at run time.")
    p.add_argument("artifact", help="a .atom file or an artifact folder")
    p.add_argument("command", choices=commands)
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the command's own arguments")
    return p.parse_args(argv)


def parse_generate_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="atom-run ART generate")
    p.add_argument("prompt", nargs="+", help="one or more prompts")
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    sampling = p.add_argument_group("sampling")
    sampling.add_argument("--max-tokens", type=int, default=64)
    sampling.add_argument("--temperature", type=float, default=0.0)
    sampling.add_argument("--top-p", type=float, default=1.0)
    sampling.add_argument("--top-k", type=int, default=-1)
    sampling.add_argument("--seed", dest="prompt_seed", type=int, default=None, help="the prompts' sampling seed")
    sampling.add_argument("--ignore-eos", action="store_true")
    # --seed above is the prompts' own: the engine's default seed only serves requests without one
    add_arguments(p.add_argument_group("engine"), RuntimeConfig, exclude=("seed",))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv, tuple(COMMANDS))
    return run_command(args.artifact, args.command, args.rest)


def run_command(artifact: str, command: str, argv: list[str]) -> int:
    from atom_aot.cli_util import run_cli
    return run_cli(lambda: COMMANDS[command](artifact, argv))


def generate(artifact: str, argv: list[str]) -> int:
    from atom_aot.runtime.llm_engine import ArtifactEngine
    from atom_aot.runtime.sampling_params import SamplingParams
    args = parse_generate_args(argv)
    config = from_namespace(RuntimeConfig, args)       # a bad engine flag fails here, before any load
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.prompt_seed, ignore_eos=args.ignore_eos)
    t0 = time.perf_counter()
    engine = ArtifactEngine(artifact, config)
    try:
        timings = dict(engine.loaded.timings)
        timings["engine ready"] = time.perf_counter() - t0
        prompts = [engine.apply_chat_template([{"role": "user", "content": p}]) if args.chat else p
                   for p in args.prompt]
        start = time.perf_counter()
        first_token, results = _run_to_completion(engine, prompts, params)
        elapsed = time.perf_counter() - start
        timings["first token"] = first_token - start
        for out, prompt in zip(results, args.prompt):
            print(f"--- {prompt!r}\n{out.text}\n[{out.num_tokens_output} tokens, finish: {out.finish_reason}]")
        _report(engine, timings, first_token - t0, sum(r.num_tokens_output for r in results), elapsed)
    finally:
        engine.close()
    return 0


def _run_to_completion(engine, prompts: list[str], params) -> tuple[float, list]:
    """(time of the first token, the finished outputs in prompt order)."""
    first_token = {}
    ids = engine.add_request(prompts, params, stream_callback=lambda u: first_token.setdefault("t", time.perf_counter()))
    results = {}
    while not engine.is_finished():
        for update in engine.step():
            if update.finished:
                results[update.request_id] = update
    return first_token.get("t", time.perf_counter()), [results[i] for i in ids]


def _report(engine, timings: dict[str, float], start_to_first_token: float, tokens: int, elapsed: float) -> None:
    from atom_aot.runtime.loading.compile_counter import compile_counts
    print("\nstartup: " + seconds_listed(timings)
          + f" | start to first token {start_to_first_token:.2f}s", file=sys.stderr)
    ranks = getattr(engine.core, "info", None)     # a data-parallel-attention artifact's ranks count their own
    counts = f"runtime compilations (rank 0's process): {ranks.compile_counts}" if ranks else \
        f"runtime compilations: {compile_counts()}"
    print(f"path: {engine.loaded.execution} | {tokens} tokens in {elapsed:.2f}s ({tokens / elapsed:.1f} tok/s)"
          f" | {counts}", file=sys.stderr)


def worker(artifact: str, argv: list[str]) -> int:
    """A tensor-parallel rank other than 0 (placed by RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    p = argparse.ArgumentParser(prog="atom-run ART worker", description="Run tensor-parallel rank RANK (>= 1) of the "
                                "engine whose rank 0 is `atom-run ART serve|generate`; engine flags as rank 0's.")
    add_arguments(p, RuntimeConfig)
    config = from_namespace(RuntimeConfig, p.parse_args(argv))
    from atom_aot.runtime.parallel.tp_worker import run_worker
    run_worker(artifact, config)
    return 0


def inspect(artifact: str, argv: list[str]) -> int:
    """The artifact's description; `--measurements`: also the kernel timings its build's choices rest on."""
    from atom_aot.artifact.reader import Artifact
    from atom_aot.runtime.inspect import describe, measurement_lines
    p = argparse.ArgumentParser(prog="atom-run ART inspect")
    p.add_argument("--measurements", action="store_true",
                   help="the build's kernel timings (ms) per op and shape, fastest candidates first")
    args = p.parse_args(argv)
    art = Artifact.open(artifact)
    print(describe(art))
    if args.measurements:
        print("measurements (ms, fastest first)")
        print("\n".join(measurement_lines(art.read_tuning().measurements_ms)))
    return 0


def verify(artifact: str, argv: list[str]) -> int:
    """Origin (with --trusted-keys: signed by one of them), integrity (every member's sha256), then whether this
    machine can load it (the loader's own check). Exit 0 when signed as asked and intact, even if not loadable
    here: the last line says which."""
    from atom_aot.artifact.reader import Artifact
    from atom_aot.runtime.loading.loader import load_problem, machine_target
    p = argparse.ArgumentParser(prog="atom-run ART verify")
    p.add_argument("--trusted-keys", default=None, metavar="DIR", help="fail unless one of the ed25519 public keys "
                   "(*.pem, *.pub) in DIR signed the artifact (docs/artifact-format.md)")
    args = p.parse_args(argv)
    art = Artifact.open(artifact, args.trusted_keys)
    art.verify(full=True)
    manifest = art.manifest
    print(f"integrity OK: the manifest matches its checksum and all {len(manifest.members)} members match their "
          f"sha256 in it (build key {manifest.build_key[:12]}).")
    print(origin_line(art))
    problem = load_problem(manifest)
    here = machine_target()
    print(f"loadable here: no: {problem}" if problem else
          f"loadable here: yes: its arch, toolchain and forward signature match this machine ({here.arch}, "
          f"torch {here.torch}, cpu isa {here.cpu_isa})")
    return 0


def origin_line(art) -> str:
    """Who signed the artifact, and whether that was checked against trusted keys."""
    if art.signer is not None:
        return f"signature OK: signed by {art.signer.describe()}, one of the trusted keys asked for."
    signer = art.read_signer()
    if signer is None:
        return ("signature: none. This says the artifact is intact, not who built it; atom-build --sign ART "
                "--sign-key KEY signs it.")
    return (f"signature: by key {signer.fingerprint}, and it matches the manifest; pass --trusted-keys DIR to "
            f"require that key to be one you trust.")


COMMANDS = {"generate": generate, "inspect": inspect, "verify": verify, "worker": worker}


if __name__ == "__main__":
    sys.exit(main())
