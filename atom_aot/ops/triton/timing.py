"""How kernels are timed, by the build's tuning and by scripts/bench_kernels.py alike."""
from __future__ import annotations

import torch


def measure_ms(fn, warmup_ms: int = 10, rep_ms: int = 40) -> tuple[float, bool]:
    """Median ms of one call, and whether it ran captured in a CUDA graph.

    The call is captured in a CUDA graph (no Python launch overhead, as the runtime replays it)
    and replayed under do_bench, which flushes L2 before each replay; if capture fails, the
    plain call is timed instead.
    """
    import triton.testing
    fn()   # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
        run, captured = graph.replay, True
    except Exception:  # noqa: BLE001  (some ops cannot be captured; time them as they are)
        run, captured = fn, False
    ms = triton.testing.do_bench(run, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    del graph
    return ms, captured
