"""Each running sequence's sampling parameters as columns of host arrays, written once when the sequence gets its
row (it joins the runner's persistent batch) and cleared when it leaves, so that a step gathers its rows' values
with one numpy index per column instead of reading every sequence's SamplingParams again (the rows are
runtime/execution/persistent_rows.py's, one per sequence that holds KV blocks)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from atom_aot.runtime.sampling_params import SamplingParams


@dataclass(frozen=True)
class SamplingBatch:
    """The sampling parameters of a step's sampling sequences, one entry per sequence in batch order."""
    temperature: np.ndarray      # [N] float32; 1.0 for a greedy row (its draw is the argmax anyway)
    top_k: np.ndarray            # [N] int64; <= 0 keeps the whole vocabulary
    top_p: np.ndarray            # [N] float32
    min_p: np.ndarray            # [N] float32
    greedy: np.ndarray           # [N] bool
    masks: np.ndarray            # [N] bool: top-k, top-p or min-p cut the row
    processes: np.ndarray        # [N] bool: a logits processor changes the row (runtime/sampling/logits_processors.py)

    @classmethod
    def of(cls, params: list[SamplingParams]) -> SamplingBatch:
        """From the parameters themselves (callers without persistent rows: the verifier, the graph probe)."""
        columns = SamplingColumns(max(len(params), 1))
        for row, p in enumerate(params):
            columns.write(row, p)
        return columns.gather(np.arange(len(params)))

    @property
    def all_greedy(self) -> bool:
        return bool(self.greedy.all())

    @property
    def drawn_masks(self) -> bool:
        """Whether any drawn (not greedy) row is masked."""
        return bool((self.masks & ~self.greedy).any())

    @property
    def drawn_all_top_k(self) -> bool:
        """Whether every drawn row has a top-k (then the draw runs among the batch's largest-k candidates)."""
        return bool((self.top_k[~self.greedy] > 0).all())

    @property
    def any_processes(self) -> bool:
        return bool(self.processes.any())


class SamplingColumns:
    """One entry per persistent row, grown (doubled) when rows are added."""

    def __init__(self, num_rows: int):
        self.temperature = np.ones(num_rows, dtype=np.float32)
        self.top_k = np.full(num_rows, -1, dtype=np.int64)
        self.top_p = np.ones(num_rows, dtype=np.float32)
        self.min_p = np.zeros(num_rows, dtype=np.float32)
        self.greedy = np.zeros(num_rows, dtype=bool)
        self.masks = np.zeros(num_rows, dtype=bool)
        self.processes = np.zeros(num_rows, dtype=bool)

    def write(self, row: int, p: SamplingParams) -> None:
        """A sequence joins at `row`: its parameters, read once."""
        self.temperature[row] = p.temperature or 1.0
        self.top_k[row], self.top_p[row], self.min_p[row] = p.top_k, p.top_p, p.min_p
        self.greedy[row] = p.greedy
        self.masks[row] = p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0
        self.processes[row] = p.processes_logits

    def clear(self, row: int) -> None:
        """A sequence left `row`: back to the values of an unused row."""
        self.temperature[row], self.top_k[row], self.top_p[row], self.min_p[row] = 1.0, -1, 1.0, 0.0
        self.greedy[row] = self.masks[row] = self.processes[row] = False

    def grow(self, num_rows: int) -> None:
        """Room for `num_rows` rows; the new ones unused."""
        fresh = SamplingColumns(num_rows)
        for name, column in vars(fresh).items():
            column[:len(getattr(self, name))] = getattr(self, name)
            setattr(self, name, column)

    def gather(self, rows: np.ndarray) -> SamplingBatch:
        """The batch of these rows, in their order."""
        return SamplingBatch(self.temperature[rows], self.top_k[rows], self.top_p[rows], self.min_p[rows],
                             self.greedy[rows], self.masks[rows], self.processes[rows])
