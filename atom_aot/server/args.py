"""Command-line flags of `atom-run ART serve` / `python -m atom_aot.server ART`; the serve entry
that takes a model (atom_aot/entrypoints/openai_server.py) adds its build flags to the same ones."""
from __future__ import annotations

import argparse

from atom_aot.artifact.manifest import Manifest
from atom_aot.config_flags import add_arguments, from_namespace
from atom_aot.runtime.config import RuntimeConfig
from atom_aot.runtime.processes.prefix_routing import ROUTINGS
from atom_aot.runtime.profiler import dir_from_env
from atom_aot.server.lifecycle.guards import DEFAULT_MAX_BODY_BYTES
from atom_aot.server.options import ServerOptions


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="atom-run ART serve",
                                description="Serve an atom-aot artifact over an OpenAI-compatible HTTP API.")
    p.add_argument("artifact", help="a .atom file or an artifact folder")
    add_server_arguments(p)
    p.set_defaults(model=None)
    return check_server_args(p, p.parse_args(argv))


def add_server_arguments(p: argparse.ArgumentParser, underscore_aliases: bool = False,
                         port_flags: tuple[str, ...] = ("--port", "--server-port"),
                         defaults: dict | None = None) -> None:
    """The HTTP, limits and engine flags, shared by both serve entries (underscore_aliases: also
    ATOM's spellings, e.g. --max_model_len). port_flags: the HTTP port's spellings (ATOM's entry point
    keeps --port for ATOM's engine port); defaults: per-entry defaults of these flags (ATOM's host, ...)."""
    defaults = defaults or {}
    http = p.add_argument_group("HTTP")
    host = defaults.get("host", "127.0.0.1")
    http.add_argument("--host", default=host, help=f"address to bind (default {host}; 127.0.0.1: this machine "
                      "only; 0.0.0.0 exposes the server to the network)")
    http.add_argument(*port_flags, dest="port", type=int, default=8000, help="the HTTP port (default 8000)")
    http.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/*, the "
                      "tokenizer routes, /version and the profiler routes")
    http.add_argument("--served-model-name", default=None, help="the model name clients send (default: --model "
                      "as given, else the artifact's model name)")
    http.add_argument("--max-request-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    http.add_argument("--torch-profiler-dir", default=dir_from_env(), help="enables /start_profile and "
                      "/stop_profile; gzipped traces go to DIR/rank_<r>/ (default: $ATOM_TORCH_PROFILER_DIR; "
                      "ATOM_PROFILER_MORE=1 also records stacks and memory)")
    http.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    http.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for the engine")
    http.add_argument("-dp", "--data-parallel-size", dest="data_parallel_size", type=int, default=1,
                      help="engine processes, each with a whole replica of the model (its tensor-parallel ranks "
                           "included); requests are routed by --dp-routing")
    http.add_argument("--dp-routing", choices=ROUTINGS, default=None,
                      help="how requests are spread over data-parallel engines (-dp replicas, or the ranks of a "
                           "data-parallel-attention artifact): prefix: to the engine given the longest prefix of the "
                           "prompt before (its prefix cache holds it) unless it has 8 more requests in flight than "
                           "the least-loaded one (the default); load: to the one with the fewest in flight. Refused "
                           "where there is one engine")
    add_arguments(p.add_argument_group("limits and timeouts"), ServerOptions, defaults,
                  underscore_aliases=underscore_aliases)
    add_arguments(p.add_argument_group("engine"), RuntimeConfig, defaults, underscore_aliases=underscore_aliases)


def check_server_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    if args.max_request_body_bytes < 1024:
        p.error("--max-request-body-bytes must be >= 1024")
    if args.data_parallel_size < 1:
        p.error("-dp/--data-parallel-size must be >= 1")
    return args


def served_model_name(args: argparse.Namespace, manifest: Manifest) -> str:
    """What clients send as `model`: --served-model-name, else --model exactly as the user passed it
    (ATOM's and vLLM's default), else the name the artifact recorded."""
    return args.served_model_name or args.model or manifest.model.name


def runtime_config(args: argparse.Namespace) -> RuntimeConfig:
    """The engine's RuntimeConfig from the flags (raises ValueError with the reason)."""
    return from_namespace(RuntimeConfig, args)


def server_options(args: argparse.Namespace) -> ServerOptions:
    """The server's limits and timeouts from the flags (raises ValueError with the reason)."""
    return from_namespace(ServerOptions, args)


def engine_client(args: argparse.Namespace, config: RuntimeConfig, manifest: Manifest):
    """The server's engine client, not started, from the composition root (runtime/launch.py launch_served)."""
    from atom_aot.runtime.launch import Topology, launch_served
    return launch_served(args.artifact, config, manifest, Topology(args.data_parallel_size, args.dp_routing),
                         args.torch_profiler_dir, args.log_level)
