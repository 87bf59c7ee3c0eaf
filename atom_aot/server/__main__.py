"""`python -m atom_aot.server ART [--host ...]` (also `atom-run ART serve ...`).

Starts the engine process, loads the tokenizer meanwhile (from the artifact, no weights), then
serves HTTP with uvicorn on the same event loop. Exit status: 0 after a drained stop (SIGTERM,
SIGINT); 2 for a startup failure, printed as one paragraph; 3 when the engine process died
while serving (lifecycle/shutdown.py).
"""
from __future__ import annotations

import asyncio
import logging
import socket
import sys

log = logging.getLogger("atom_aot.server")


def main(argv=None) -> int:
    from atom_aot.cli_util import run_cli
    from atom_aot.server.args import parse_args
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    return run_cli(lambda: asyncio.run(serve(args)))


async def serve(args) -> int:
    from atom_aot.artifact.reader import Artifact
    from atom_aot.server.args import engine_client, runtime_config, server_options
    config, options = runtime_config(args), server_options(args)   # a bad flag fails first, with its reason
    # before the heavy imports: a wrong path, or one no trusted key signed, fails at once
    artifact = Artifact.open(args.artifact, config.trusted_keys)
    config.served_max_model_len(artifact.manifest.numerics.max_model_len)   # before the engine loads
    from atom_aot.runtime.text.tokenizer import load_tokenizer

    logging.getLogger("atom_aot").setLevel(args.log_level.upper())
    listener = _listen(args.host, args.port)    # a taken port fails now, not after loading the model
    client = engine_client(args, config, artifact.manifest)
    try:
        tokenizer = asyncio.create_task(asyncio.to_thread(load_tokenizer, artifact.member_dir("tokenizer")))
        info = await client.start(timeout=args.startup_timeout)
        return await _serve_http(args, options, artifact, client, info, await tokenizer, listener)
    finally:
        await client.shutdown()
        listener.close()


async def _serve_http(args, options, artifact, client, info, tokenizer, listener: socket.socket) -> int:
    """Serve until a signal's drain ends or the engine dies; returns the exit status."""
    from atom_aot.server.app import build_app
    from atom_aot.server.args import served_model_name
    from atom_aot.server.serving.async_engine import AsyncEngine
    from atom_aot.server.lifecycle.shutdown import Lifecycle, QuietServer, uvicorn_config
    from atom_aot.server.lifecycle.metrics import ServerMetrics
    from atom_aot.server.state import ServerState
    metrics = ServerMetrics()
    engine = AsyncEngine(client, tokenizer, metrics, options.max_queued_seqs, options.stalled_stream_timeout)
    state = ServerState(engine=engine, tokenizer=tokenizer, info=info, options=options, metrics=metrics,
                        model_name=served_model_name(args, artifact.manifest), api_key=args.api_key)
    server = QuietServer(uvicorn_config(build_app(state, args.max_request_body_bytes), args.host, args.port,
                                       args.log_level))
    log.info("serving %r (%s, max_model_len %d) on http://%s:%d", state.model_name, info.execution,
             info.max_model_len, args.host, args.port)
    with Lifecycle(state, server, options.shutdown_timeout).running() as lifecycle:
        await server.serve(sockets=[listener])
    return lifecycle.exit_code


def _listen(host: str, port: int) -> socket.socket:
    from atom_aot.errors import StartupError
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {e.strerror or e}. Pick another --port "
                           f"(or stop what uses it).") from None
    return sock


if __name__ == "__main__":
    sys.exit(main())
