"""The engine flags of the offline examples, as ATOM's examples take its EngineArgs
(`python -m atom_aot.examples.simple_inference --model M --kv_cache_dtype fp8 -tp 8`): the build
options (a model is built into the artifact cache with them), the runtime options, and ATOM's
spellings of both (atom_flags.py), turned into `LLMEngine`'s keyword options."""
from __future__ import annotations

import argparse

from atom_aot.artifact.build_options import DECIDED_AT_SERVE_TIME, BuildOptions
from atom_aot.config_flags import add_arguments, cli_fields
from atom_aot.entrypoints.atom_flags import add_atom_arguments, announce, read_atom_flags
from atom_aot.logging_setup import show_engine_logs
from atom_aot.runtime.config import RuntimeConfig


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """--model's build flags, the engine's runtime flags and ATOM's engine flags (not --torch-profiler-dir:
    each example says what it does with it)."""
    build = p.add_argument_group("build (part of the build key of a model built here; refused with an artifact)")
    add_arguments(build, BuildOptions, exclude=DECIDED_AT_SERVE_TIME, underscore_aliases=True)
    build.add_argument("--cache-dir", "--cache_dir", dest="cache_dir", default=None,
                       help="artifact cache (default: $ATOM_AOT_ARTIFACTS, else ./artifacts)")
    add_arguments(p.add_argument_group("engine"), RuntimeConfig, underscore_aliases=True)
    add_atom_arguments(p, engine_port=False)


def engine_options(args: argparse.Namespace) -> dict:
    """LLMEngine's options from the flags: the build options the user changed, every runtime option.
    Raises AtomFlagError (a ValueError) for an ATOM flag refused; logs what an accepted one means."""
    read_atom_flags(args)
    show_engine_logs()
    announce(args)
    build = {f.name: getattr(args, f.name) for f in cli_fields(BuildOptions)
             if f.name not in DECIDED_AT_SERVE_TIME and getattr(args, f.name) != f.default}
    runtime = {f.name: getattr(args, f.name) for f in cli_fields(RuntimeConfig)}
    return build | runtime | ({"cache_dir": args.cache_dir} if args.cache_dir else {})
