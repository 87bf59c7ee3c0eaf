"""`atom-run ART {generate,serve,inspect,verify}`: use an artifact, never compile.

`serve` is the HTTP server (atom_aot/server); the others are the runtime's (atom_aot/runtime/cli.py).
"""
from __future__ import annotations

import sys

from atom_aot.runtime import cli as runtime_cli

COMMANDS = (*runtime_cli.COMMANDS, "serve")


def main(argv: list[str] | None = None) -> int:
    args = runtime_cli.parse_args(sys.argv[1:] if argv is None else list(argv), COMMANDS)
    if args.command == "serve":
        from atom_aot.server.__main__ import main as serve_main
        return serve_main([args.artifact] + args.rest)
    return runtime_cli.run_command(args.artifact, args.command, args.rest)


if __name__ == "__main__":
    sys.exit(main())
