"""ATOM's engine flags as ATOM's command lines write them (its EngineArgs and its OpenAI server), read
onto atom-aot's options: each one is mapped to the option of the same meaning, or refused by its name
with the option that does what the user wanted. The mapping lives here, apart from the core flags.

| ATOM                                  | atom-aot                                                       |
| --enable_prefix_caching / --no-...    | prefix caching on / off (RuntimeConfig.enable_prefix_caching)  |
| --cudagraph-capture-sizes "[1,2,4]"   | --capture-sizes 1,2,4 ("[]": none)                             |
| --cudagraph-mode NONE / FULL          | --capture-sizes none / the default (full graphs of decode)     |
| --level 3 / 0                         | --compile aoti (default) / eager: --enforce-eager, and a model |
|                                       | is built with --compile none                                   |
| --load_dummy                          | --load-format dummy                                            |
| --enable-dp-attention                 | -dp N --enable-expert-parallel (data-parallel attention)       |
| --trust-remote-code                   | accepted: no code from a model repository is ever run          |
| --enable_chunked_prefill              | what the scheduler always does                                 |
| --port (engine's internal port)       | 8006 only: the engine talks to the front end over ipc sockets  |
Refused by name: --level 1/2, --cudagraph-mode PIECEWISE/FULL_AND_PIECEWISE, --mark-trace,
--no-enable_chunked_prefill, --long-prefill-token-threshold N > 0, --index-cache-dtype.
"""
from __future__ import annotations

import argparse
import ast
import logging

log = logging.getLogger("atom_aot")

ATOM_ENGINE_PORT = 8006
# The ATOM entry point's defaults where ATOM's differ from atom-run serve's (vLLM's).
ATOM_SERVER_DEFAULTS = {"host": "0.0.0.0", "default_completion_max_tokens": 256}
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_AND_PIECEWISE")
PROFILE_INSTEAD = ("use --torch-profiler-dir DIR and POST /start_profile, /stop_profile: every engine step is "
                   "labelled prefill[bs=..,tokens=..] or decode[bs=..,tokens=..] in the trace")


class AtomFlagError(ValueError):
    """An ATOM flag atom-aot cannot honour; the message names it and says what to use instead."""


def add_atom_arguments(p: argparse.ArgumentParser, engine_port: bool) -> None:
    """ATOM's spellings of options atom-aot reads its own way. engine_port: also ATOM's --port (the engine's
    internal port), for the ATOM entry point, where --server-port is the HTTP port."""
    g = p.add_argument_group("ATOM's engine flags (read onto the options above)")
    g.add_argument("--enable-prefix-caching", "--enable_prefix_caching", dest="enable_prefix_caching",
                   action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                   help="reuse cached prompt blocks (default: on; --no-enable_prefix_caching turns it off)")
    g.add_argument("--trust-remote-code", "--trust_remote_code", action="store_true",
                   help="accepted for ATOM's and vLLM's command lines: atom-aot runs no code from a model "
                        "repository (its architectures are built in)")
    g.add_argument("--level", type=int, default=None, help="ATOM's compilation level: 3 = compiled ahead of "
                   "time (the default); 0 = eager (--enforce-eager; a model is built with --compile none)")
    g.add_argument("--cudagraph-capture-sizes", "--cudagraph_capture_sizes", default=None,
                   help='CUDA-graph batch sizes as ATOM writes them, e.g. "[1,2,4,8]" (= --capture-sizes 1,2,4,8)')
    g.add_argument("--cudagraph-mode", "--cudagraph_mode", choices=CUDAGRAPH_MODES, default=None,
                   help="NONE: no CUDA graphs (= --capture-sizes none); FULL: full graphs of decode steps (the "
                        "default); PIECEWISE and FULL_AND_PIECEWISE are refused (the forward is compiled whole)")
    g.add_argument("--load_dummy", "--load-dummy", dest="load_dummy", action="store_true",
                   help="random weights, none read (= --load-format dummy)")
    g.add_argument("--enable-dp-attention", "--enable_dp_attention", dest="enable_dp_attention",
                   action="store_true", help="data-parallel attention: needs -dp N and --enable-expert-parallel "
                                             "(which build it already)")
    g.add_argument("--mark-trace", "--mark_trace", dest="mark_trace", action="store_true",
                   help=f"refused: {PROFILE_INSTEAD}")
    g.add_argument("--enable-chunked-prefill", "--enable_chunked_prefill", dest="enable_chunked_prefill",
                   action=argparse.BooleanOptionalAction, default=None,
                   help="prompts longer than the step's budget are always chunked; the --no- form is refused")
    g.add_argument("--long-prefill-token-threshold", "--long_prefill_token_threshold", type=int, default=None,
                   help="refused above 0: a prompt in progress takes at most half of a step's remaining budget")
    g.add_argument("--index-cache-dtype", "--index_cache_dtype", default=None,
                   help="refused: no model here has a sparse-attention indexer cache")
    if engine_port:
        g.add_argument("--port", dest="engine_port", type=int, default=ATOM_ENGINE_PORT,
                       help=f"ATOM's engine-internal port; only {ATOM_ENGINE_PORT} is accepted (the engine and the "
                            f"HTTP front end talk over local ipc sockets); the HTTP port is --server-port")


def read_atom_flags(args: argparse.Namespace) -> None:
    """Set the atom-aot options ATOM's flags stand for, on `args`; raise AtomFlagError for one refused."""
    _refuse_unsupported(args)
    _read_compilation(args)
    _read_graphs(args)
    if args.load_dummy and args.load_format == "auto":
        args.load_format = "dummy"
    if args.enable_dp_attention and not (args.data_parallel_size > 1 and args.enable_expert_parallel
                                         and args.tensor_parallel_size == 1):
        raise AtomFlagError(
            f"--enable-dp-attention: atom-aot builds data-parallel attention for MoE models from -dp N "
            f"--enable-expert-parallel with -tp 1 (got -dp {args.data_parallel_size}, -tp "
            f"{args.tensor_parallel_size}{'' if args.enable_expert_parallel else ', no --enable-expert-parallel'}); "
            f"a dense model is replicated with -dp N alone")


def announce(args: argparse.Namespace) -> None:
    """Say what an accepted ATOM flag that changes nothing here means (so it is not silently ignored)."""
    if args.trust_remote_code:
        log.info("--trust-remote-code: no code from the model's repository is run: atom-aot's model architectures "
                 "are built in (atom_aot/models), and the model is read from its config.json and weights only")
    if args.level == 0:
        log.info("--level 0: the model runs eagerly (--enforce-eager), without compiled code or CUDA graphs")


def _refuse_unsupported(args: argparse.Namespace) -> None:
    if args.mark_trace:
        raise AtomFlagError(f"--mark-trace: ATOM marks graph nodes for its traces; atom-aot's graphs are compiled "
                            f"ahead of time with no markers to add: {PROFILE_INSTEAD}")
    if args.enable_chunked_prefill is False:
        raise AtomFlagError("--no-enable_chunked_prefill: atom-aot always chunks a prompt longer than a step's "
                            "budget; give --max-num-batched-tokens at least --max-model-len so that none is chunked")
    if args.long_prefill_token_threshold:
        raise AtomFlagError(f"--long-prefill-token-threshold {args.long_prefill_token_threshold}: atom-aot has no "
                            f"such threshold: a prompt in progress takes at most half of a step's remaining token "
                            f"budget while new prompts wait; --max-num-batched-tokens sets the budget")
    if args.index_cache_dtype is not None:
        raise AtomFlagError(f"--index-cache-dtype {args.index_cache_dtype}: no model atom-aot builds has a "
                            f"sparse-attention indexer cache (DeepSeek-V3.2's); the KV cache's is --kv-cache-dtype")
    port = getattr(args, "engine_port", ATOM_ENGINE_PORT)
    if port != ATOM_ENGINE_PORT:
        raise AtomFlagError(f"--port {port}: in ATOM this is the engine's internal port; atom-aot's engine talks to "
                            f"its HTTP front end over local ipc sockets, so there is no port to move (only "
                            f"{ATOM_ENGINE_PORT}, ATOM's default, is accepted). The HTTP port is --server-port")


def _read_compilation(args: argparse.Namespace) -> None:
    if args.level is None or args.level == 3:
        if args.level == 3 and args.compile == "none":
            raise AtomFlagError("--level 3 with --compile none: level 3 is the compiled model; drop one of them")
        return
    if args.level in (1, 2):
        raise AtomFlagError(f"--level {args.level}: atom-aot compiles the whole graph ahead of time (level 3, the "
                            f"default) or not at all (--level 0); it has no partial levels")
    if args.level != 0:
        raise AtomFlagError(f"--level must be 0, 1, 2 or 3 (ATOM's compilation levels), got {args.level}")
    args.enforce_eager = True
    from atom_aot.entrypoints.llm import is_artifact
    if not is_artifact(args.model):
        args.compile = "none"              # nothing compiled is run, so nothing is compiled


def _read_graphs(args: argparse.Namespace) -> None:
    sizes = None if args.cudagraph_capture_sizes is None else parse_size_list(args.cudagraph_capture_sizes)
    if args.cudagraph_mode in ("PIECEWISE", "FULL_AND_PIECEWISE"):
        raise AtomFlagError(f"--cudagraph-mode {args.cudagraph_mode}: atom-aot compiles the forward whole, so there "
                            f"are no pieces to capture: decode steps replay full graphs (--cudagraph-mode FULL, the "
                            f"default) and other steps run the compiled package; NONE turns graphs off")
    if args.cudagraph_mode == "NONE":
        if sizes:
            raise AtomFlagError(f"--cudagraph-mode NONE with --cudagraph-capture-sizes {args.cudagraph_capture_sizes}:"
                                f" NONE captures no graphs; drop one of them")
        sizes = ()
    if sizes is None:
        return
    if args.capture_sizes is not None and tuple(args.capture_sizes) != sizes:
        raise AtomFlagError(f"--cudagraph-capture-sizes {args.cudagraph_capture_sizes} and --capture-sizes "
                            f"{','.join(map(str, args.capture_sizes)) or 'none'} disagree; give one of them")
    args.capture_sizes = sizes


def parse_size_list(text: str) -> tuple[int, ...]:
    """ATOM's "[1,2,4,8]" (a Python list literal) as increasing sizes; "[]" is none."""
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        value = None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                                        for v in value):
        raise AtomFlagError(f"--cudagraph-capture-sizes must be a list of positive integers such as "
                            f"\"[1,2,4,8]\", got {text!r}")
    return tuple(sorted(set(value)))
