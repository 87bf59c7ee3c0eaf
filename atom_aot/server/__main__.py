"""`python -m atom_aot.server ART [--host ...]` (also `atom-run ART serve ...`).

Starts the engine process, loads the tokenizer meanwhile (from the artifact, no weights), then
serves HTTP with uvicorn on the same event loop. A startup failure prints one paragraph and
exits 2; stopping the server (Ctrl-C, SIGTERM) stops the engine too.
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
    from atom_aot.server.args import runtime_config
    config = runtime_config(args)               # a bad engine flag fails first, with its reason
    artifact = Artifact.open(args.artifact)     # before the heavy imports: a wrong path fails at once
    import uvicorn

    from atom_aot.runtime.tokenizer import load_tokenizer
    from atom_aot.server.app import build_app
    from atom_aot.server.async_engine import AsyncEngine
    from atom_aot.server.engine_client import EngineClient
    from atom_aot.server.metrics import ServerMetrics
    from atom_aot.server.state import ServerState

    logging.getLogger("atom_aot").setLevel(args.log_level.upper())
    listener = _listen(args.host, args.port)    # a taken port fails now, not after loading the model
    client = EngineClient(args.artifact, config, args.torch_profiler_dir, args.log_level)
    try:
        tokenizer = asyncio.create_task(asyncio.to_thread(load_tokenizer, artifact.member_dir("tokenizer")))
        info = await client.start(timeout=args.startup_timeout)
        metrics = ServerMetrics()
        state = ServerState(engine=AsyncEngine(client, await tokenizer, metrics), tokenizer=await tokenizer,
                            info=info, model_name=args.served_model_name or artifact.manifest.model.name,
                            metrics=metrics, api_key=args.api_key)
        app = build_app(state, args.max_request_body_bytes)
        server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                               timeout_graceful_shutdown=5, loop="none"))
        log.info("serving %r (%s, max_model_len %d) on http://%s:%d", state.model_name, info.execution,
                 info.max_model_len, args.host, args.port)
        await server.serve(sockets=[listener])
    finally:
        await client.shutdown()
        listener.close()
    return 0


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
