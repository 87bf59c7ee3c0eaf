"""The offline engine's log lines reach its user as vLLM's do. Unless the program has configured logging,
`atom_aot` logs INFO and above to stderr: which path runs (compiled or eager, the all-reduce's, how the
tensor-parallel ranks started), the KV cache's size, what fell back and why. Before, a program that only made an
`LLMEngine` saw none of it (rank 0 said nothing while its spawned ranks, started by the CLI, did).
`ATOM_LOGGING_LEVEL` (DEBUG, INFO, WARNING, ERROR) sets the level."""
from __future__ import annotations

import logging
import os

LEVEL_VARIABLE = "ATOM_LOGGING_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# Every process's lines (the CLI's, the server's engine process, the offline engine's) carry the wall clock to
# the millisecond, as vLLM's do: the ranks of a tensor-parallel start log from separate processes, and only the
# clock lines their steps up against each other.
FORMAT = "%(levelname)s %(asctime)s.%(msecs)03d %(name)s: %(message)s"
DATE_FORMAT = "%m-%d %H:%M:%S"


def show_engine_logs(environ=os.environ) -> None:
    """Give the `atom_aot` logger a stderr handler at ATOM_LOGGING_LEVEL, unless the program configured
    logging (a handler on the root logger or on `atom_aot`): then its configuration decides."""
    logger = logging.getLogger("atom_aot")
    if logger.handlers or logging.getLogger().handlers:
        return
    level = environ.get(LEVEL_VARIABLE, "INFO").upper()
    if level not in LEVELS:
        raise ValueError(f"{LEVEL_VARIABLE}={environ[LEVEL_VARIABLE]!r}: expected one of {', '.join(LEVELS)}")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False            # a root handler the program adds later would print each line twice


def seconds_listed(timings: dict[str, float], strip: str = "") -> str:
    """`name 1.23s, ...` (each name without the prefix `strip`): how the start-up lines list their parts."""
    return ", ".join(f"{name.removeprefix(strip)} {seconds:.2f}s" for name, seconds in timings.items())
