"""A progress bar per build stage and the timings for the summary."""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager

from tqdm import tqdm


class StageProgress:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str, total: int | None = None):
        start = time.perf_counter()
        bar = tqdm(total=total or 1, desc=f"{name:<18}", unit="" if total is None else " tensors",
                   disable=not self.enabled, file=sys.stderr, leave=True,
                   bar_format="{desc} {bar:20} {n_fmt}/{total_fmt} [{elapsed}]")
        try:
            yield bar
            if total is None:
                bar.update(1)
        finally:
            bar.close()
            self.seconds[name] = round(time.perf_counter() - start, 3)
