"""Shared by the command-line tools: user-facing errors print as one paragraph, not a traceback."""
from __future__ import annotations

import logging
import sys
import textwrap

EXIT_USER_ERROR = 2


def user_errors() -> tuple[type[BaseException], ...]:
    from atom_aot.build.pipeline import BuildError
    from atom_aot.models.registry import UnsupportedArchitectureError
    from atom_aot.runtime.artifact import ArtifactError
    from atom_aot.runtime.engine_core import RequestError
    from atom_aot.runtime.startup import StartupError
    return (ArtifactError, BuildError, StartupError, RequestError, UnsupportedArchitectureError, ValueError,
            FileNotFoundError)


def run_cli(fn) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return fn()
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if isinstance(e, user_errors()):
            print("error: " + textwrap.fill(str(e), width=100, subsequent_indent="  "), file=sys.stderr)
            return EXIT_USER_ERROR
        raise
