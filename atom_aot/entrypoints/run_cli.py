"""`atom-run ART {generate,serve,inspect,verify,worker}`: use an artifact, never compile.

`serve` is the HTTP server (atom_aot/server); the others are the runtime's (atom_aot/runtime/cli.py).
`atom-run serve --model MODEL ...` (no artifact first) is ATOM's serve command: it builds the model
into the artifact cache or reuses its build, then serves (atom_aot/entrypoints/openai_server.py).
"""
from __future__ import annotations

import sys

from atom_aot.runtime import cli as runtime_cli

COMMANDS = (*runtime_cli.COMMANDS, "serve")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:
        from atom_aot.entrypoints.openai_server import main as serve_model_main
        return serve_model_main(argv[1:])
    args = runtime_cli.parse_args(argv, COMMANDS)
    if args.command == "serve":
        from atom_aot.server.__main__ import main as serve_main
        return serve_main([args.artifact] + args.rest)
    return runtime_cli.run_command(args.artifact, args.command, args.rest)


if __name__ == "__main__":
    sys.exit(main())
