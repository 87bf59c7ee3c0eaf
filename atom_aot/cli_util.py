"""Shared by the command-line tools: user-facing errors print as one paragraph, not a traceback."""
from __future__ import annotations

import logging
import sys
import textwrap

from atom_aot.errors import USER_ERRORS
from atom_aot.logging_setup import DATE_FORMAT, FORMAT

EXIT_USER_ERROR = 2


def run_cli(fn) -> int:
    logging.basicConfig(level=logging.INFO, format=FORMAT, datefmt=DATE_FORMAT)
    try:
        return fn()
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if isinstance(e, USER_ERRORS):
            print("error: " + textwrap.fill(str(e), width=100, subsequent_indent="  "), file=sys.stderr)
            return EXIT_USER_ERROR
        raise
