"""Kernel timings the build's tuning shares: one candidate's time, and the candidate that is best over shapes."""
from __future__ import annotations

import logging
import math

log = logging.getLogger("atom_aot")


def best_config(rows: dict) -> tuple[int, ...]:
    """The config with the lowest geometric-mean slowdown against each shape's fastest, among those that
    launched at every shape (None: did not fit the GPU)."""
    rows = {shape: {c: ms for c, ms in row.items() if ms is not None} for shape, row in rows.items()}
    configs = set.intersection(*(set(row) for row in rows.values()))
    def score(c):
        return sum(math.log(row[c] / min(row.values())) for row in rows.values())
    return min(configs, key=score)


def ms_unless_too_big(fn, config) -> float | None:
    """measure_ms's median, or None (logged) for a config this GPU cannot launch: too much shared memory
    (OutOfResources) or more registers per thread than its warps leave (ptxas refuses to assemble it)."""
    from triton.runtime.errors import OutOfResources, PTXASError
    from atom_aot.ops.triton.timing import measure_ms
    try:
        return measure_ms(fn)[0]
    except (OutOfResources, PTXASError) as e:
        log.info("tuning: %s does not fit this GPU (%s); not a candidate", config, e)
        return None
