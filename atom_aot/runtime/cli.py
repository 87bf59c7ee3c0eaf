"""`atom-run ART {generate,serve,inspect,verify}`: use an artifact, never compile."""
from __future__ import annotations

import argparse
import sys
import time

COMMANDS = ("generate", "serve", "inspect", "verify")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="atom-run", description="Serve or inspect an atom-aot artifact "
                                "(built by atom-build). Nothing is compiled at run time.")
    p.add_argument("artifact", help="a .atom file or an artifact folder")
    p.add_argument("command", choices=COMMANDS)
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the command's own arguments")
    return p.parse_args(argv)


def parse_generate_args(argv):
    p = argparse.ArgumentParser(prog="atom-run ART generate")
    p.add_argument("prompt", nargs="+", help="one or more prompts")
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--enforce-eager", action="store_true", help="run the model module eagerly (debugging)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    return p.parse_args(argv)


def main(argv=None) -> int:
    from atom_aot.cli_util import run_cli
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "serve":
        from atom_aot.server.__main__ import main as serve_main
        return serve_main([args.artifact] + args.rest)
    handler = {"generate": generate, "inspect": inspect, "verify": verify}[args.command]
    return run_cli(lambda: handler(args.artifact, args.rest))


def generate(artifact: str, argv: list[str]) -> int:
    from atom_aot.runtime.compile_counter import TRITON, compile_counts
    from atom_aot.runtime.llm_engine import LLMEngine
    from atom_aot.runtime.sampling_params import SamplingParams
    args = parse_generate_args(argv)
    t0 = time.perf_counter()
    TRITON.install()
    engine = LLMEngine(artifact, **_runtime_kwargs(args))
    timings = dict(engine.loaded.timings)
    timings["engine ready"] = time.perf_counter() - t0
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.seed, ignore_eos=args.ignore_eos)
    prompts = [engine.apply_chat_template([{"role": "user", "content": p}]) if args.chat else p for p in args.prompt]
    first_token = {}
    start = time.perf_counter()
    ids = engine.add_request(prompts, params,
                             stream_callback=lambda u: first_token.setdefault("t", time.perf_counter()))
    results = {}
    while not engine.is_finished():
        for update in engine.step():
            if update.finished:
                results[update.request_id] = update
    elapsed = time.perf_counter() - start
    timings["first token"] = first_token.get("t", start) - start
    for request_id, prompt in zip(ids, args.prompt):
        out = results[request_id]
        print(f"--- {prompt!r}\n{out.text}\n[{out.num_tokens_output} tokens, finish: {out.finish_reason}]")
    tokens = sum(r.num_tokens_output for r in results.values())
    print("\nstartup: " + ", ".join(f"{k} {v:.2f}s" for k, v in timings.items())
          + f" | start to first token {first_token.get('t', start) - t0:.2f}s", file=sys.stderr)
    print(f"path: {engine.loaded.execution} | {tokens} tokens in {elapsed:.2f}s ({tokens / elapsed:.1f} tok/s)"
          f" | runtime compilations: {compile_counts()}", file=sys.stderr)
    return 0


def _runtime_kwargs(args) -> dict:
    kwargs = {"enforce_eager": args.enforce_eager, "max_num_seqs": args.max_num_seqs}
    if args.kv_cache_memory_bytes:
        kwargs["kv_cache_memory_bytes"] = args.kv_cache_memory_bytes
    return kwargs


def inspect(artifact: str, argv: list[str]) -> int:
    from atom_aot.artifact.reader import Artifact
    from atom_aot.runtime.inspect import describe
    print(describe(Artifact.open(artifact)))
    return 0


def verify(artifact: str, argv: list[str]) -> int:
    """Integrity (every member's sha256), then whether this machine can load it (the loader's own
    check). Exit 0 when intact, even if not loadable here: the second line says which."""
    from atom_aot.artifact.reader import Artifact
    from atom_aot.runtime.loader import load_problem, machine_target
    art = Artifact.open(artifact)
    art.verify(full=True)
    manifest = art.manifest
    print(f"integrity OK: the manifest matches its checksum and all {len(manifest.members)} members match their "
          f"sha256 in it (build key {manifest.build_key[:12]}). This checks the artifact is intact, not who "
          f"built it: there is no signature.")
    problem = load_problem(manifest)
    here = machine_target()
    print(f"loadable here: no: {problem}" if problem else
          f"loadable here: yes: its arch, toolchain and forward signature match this machine ({here.arch}, "
          f"torch {here.torch}, cpu isa {here.cpu_isa})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
