"""The waiting queue of the priority scheduling policy (--scheduling-policy priority, vLLM's): sequences
by their request's priority (lower first), then arrival. The scheduler's other queue, SequenceQueue, is
first in, first out; this one has the same methods, each in O(log n) or O(1), so that aborting
100,000s of waiting requests stays cheap: a removed sequence leaves its heap entry behind, skipped
when it reaches the top.

A preempted sequence goes back by its own priority and arrival (`appendleft` is `append`), as vLLM
puts it back into its waiting heap.
"""
from __future__ import annotations

import heapq
import itertools
from typing import Iterator

from atom_aot.runtime.scheduling.sequence import Sequence


class PriorityQueue:
    def __init__(self):
        self._heap: list[tuple[int, float, int, str]] = []     # (priority, arrival, entry number, request id)
        self._seqs: dict[str, tuple[Sequence, int]] = {}       # request id -> (sequence, its live entry number)
        self._numbers = itertools.count()

    def __len__(self) -> int:
        return len(self._seqs)

    def __iter__(self) -> Iterator[Sequence]:
        """In the order they would be taken (sorts: for inspection, not the scheduling loop)."""
        return iter([self._seqs[entry[3]][0] for entry in sorted(self._heap) if self._is_live(entry)])

    def __reversed__(self) -> Iterator[Sequence]:
        return reversed(list(self))

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._seqs

    def first(self) -> Sequence:
        self._drop_dead_top()
        return self._seqs[self._heap[0][3]][0]

    def append(self, seq: Sequence) -> None:
        number = next(self._numbers)
        self._seqs[seq.request_id] = (seq, number)
        heapq.heappush(self._heap, (seq.params.priority, seq.arrival_time, number, seq.request_id))

    appendleft = append     # a preempted sequence: back by its priority and arrival

    def popleft(self) -> Sequence:
        seq = self.first()
        heapq.heappop(self._heap)
        del self._seqs[seq.request_id]
        return seq

    def remove(self, seq: Sequence) -> None:
        del self._seqs[seq.request_id]

    def pop(self, request_id: str) -> Sequence | None:
        entry = self._seqs.pop(request_id, None)
        return None if entry is None else entry[0]

    def _is_live(self, entry: tuple[int, float, int, str]) -> bool:
        live = self._seqs.get(entry[3])
        return live is not None and live[1] == entry[2]

    def _drop_dead_top(self) -> None:
        while self._heap and not self._is_live(self._heap[0]):
            heapq.heappop(self._heap)
        if not self._heap:
            raise IndexError("the waiting queue is empty")
