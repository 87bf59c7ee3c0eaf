"""`atom-run serve --model MODEL [build flags] [--port N]`, also `python -m
atom_aot.entrypoints.openai_server ...`: ATOM's serve command line, run as written.

The JIT path: the model (HF folder, GGUF, or none for the embedded default) is built into the
artifact cache first, through a child atom-build exactly like `LLMEngine(model=...)`, or found
there by its build key; then that artifact is served. `atom-run ART serve` skips the build
lookup and stays the fast path. Given an artifact as --model, it is served as is.

`-dp N` means what it means to vLLM: with `--ep` (and -tp 1) data-parallel attention, built into the
artifact (`atom-build -dp N --ep`, whose N ranks the server starts); otherwise N whole replicas.

ATOM's engine flags (--level, --cudagraph-capture-sizes, --load_dummy, ...) are read onto ours by
atom_flags.py in both entries. Run as `python -m atom_aot.entrypoints.openai_server`, the entry also
follows ATOM's server: --port is ATOM's engine port and --server-port the HTTP port, the host is
0.0.0.0 and a completion's max_tokens defaults to 256; `atom-run serve --model` keeps vLLM's (--port
is the HTTP port, host 127.0.0.1, max_tokens 16).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from atom_aot.artifact.build_options import DECIDED_AT_SERVE_TIME, BuildOptions
from atom_aot.config_flags import add_arguments, cli_fields

log = logging.getLogger("atom_aot.server")

# -dp is the server's flag here (replicas), and a build option only with --ep (dp_attention)
NOT_BUILD_FLAGS = (*DECIDED_AT_SERVE_TIME, "data_parallel_size")


def parse_args(argv: list[str], atom_entry: bool = False) -> argparse.Namespace:
    """atom_entry: ATOM's server's --port, --server-port and defaults (see the module doc)."""
    from atom_aot.entrypoints.atom_flags import (ATOM_SERVER_DEFAULTS, AtomFlagError, add_atom_arguments,
                                                 read_atom_flags)
    from atom_aot.server.args import add_server_arguments, check_server_args
    prog = "python -m atom_aot.entrypoints.openai_server" if atom_entry else "atom-run serve"
    p = argparse.ArgumentParser(prog=prog, description="Build a model into the artifact cache "
                                "(or reuse its cached build) and serve it over an OpenAI-compatible HTTP API.")
    p.add_argument("--model", default=None, help="HF folder, GGUF file or artifact (default: the embedded "
                   "model); also the default served model name, as given")
    build = p.add_argument_group("build (part of the build key)")
    add_arguments(build, BuildOptions, exclude=NOT_BUILD_FLAGS, underscore_aliases=True)
    build.add_argument("--cache-dir", "--cache_dir", dest="cache_dir", default=None,
                       help="artifact cache (default: $ATOM_AOT_ARTIFACTS, else ./artifacts)")
    if atom_entry:
        add_server_arguments(p, underscore_aliases=True, port_flags=("--server-port", "--server_port"),
                             defaults=ATOM_SERVER_DEFAULTS)
    else:
        add_server_arguments(p, underscore_aliases=True)
    add_atom_arguments(p, engine_port=atom_entry)
    args = check_server_args(p, p.parse_args(argv))
    try:
        read_atom_flags(args)
    except AtomFlagError as e:             # one paragraph: the usage would bury the reason
        p.exit(2, f"{prog}: error: {e}\n")
    return args


def build_flags(args: argparse.Namespace) -> dict:
    """The build options the user changed (the others keep the build's defaults)."""
    changed = {f.name: getattr(args, f.name) for f in cli_fields(BuildOptions)
               if f.name not in NOT_BUILD_FLAGS and getattr(args, f.name) != f.default}
    if dp_attention(args):
        changed["data_parallel_size"] = args.data_parallel_size
    return changed | ({"cache_dir": args.cache_dir} if args.cache_dir else {})


def dp_attention(args: argparse.Namespace) -> bool:
    """Whether -dp N builds data-parallel attention (with --ep and -tp 1, as vLLM reads it) rather than
    starting N replicas."""
    return args.enable_expert_parallel and args.data_parallel_size > 1 and args.tensor_parallel_size == 1


def resolve_artifact(args: argparse.Namespace) -> str:
    """The artifact to serve: --model itself if it is one, else its cached (or new) build."""
    from atom_aot.entrypoints.llm import build_into_cache, is_artifact, refuse_build_options
    from atom_aot.server.args import runtime_config, server_options
    build = build_flags(args)
    if is_artifact(args.model):
        refuse_build_options(args.model, build)
        log.info("serving the artifact %s given as --model (atom-run %s serve is the same)", args.model, args.model)
        return args.model
    config = runtime_config(args)
    server_options(args)                   # a bad server flag fails now, not after a build
    result = build_into_cache(args.model, build, config.max_model_len)
    if "data_parallel_size" in build:
        args.data_parallel_size = 1        # the artifact's ranks are the data-parallel engines
    how = "reused the cached artifact" if result["cached"] else "built the artifact"
    log.info("JIT path: %s %s for %s (build key %s); next time `atom-run %s serve` starts without the lookup",
             how, result["path"], args.model or "the embedded model", result["key"], result["path"])
    return str(result["path"])


def main(argv: list[str] | None = None, atom_entry: bool = False) -> int:
    from atom_aot.cli_util import run_cli
    from atom_aot.entrypoints.atom_flags import announce
    from atom_aot.server.__main__ import serve
    args = parse_args(sys.argv[1:] if argv is None else list(argv), atom_entry)

    def run() -> int:
        logging.getLogger("atom_aot").setLevel(args.log_level.upper())
        announce(args)
        args.artifact = resolve_artifact(args)
        return asyncio.run(serve(args))
    return run_cli(run)


if __name__ == "__main__":
    sys.exit(main(atom_entry=True))
