"""Host <-> device copies that never make the host wait for the device's queued work.

Reading a GPU tensor on the host (`.tolist()`, `int(t)`) or copying pageable host memory to the
GPU waits for the whole CUDA stream, every kernel queued before it. With async scheduling the
stream holds the step the GPU is computing while the host prepares the next, so such a copy would
serialize the two again. These go through pinned memory instead: the copy is queued, and the CUDA
caching host allocator keeps a pinned buffer alive until the copy that reads it has run.
"""
from __future__ import annotations

from typing import Generic, TypeVar

import numpy as np
import torch
from torch.utils._pytree import tree_map_only

Tree = TypeVar("Tree")


def to_device(values: np.ndarray | list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`values` as a tensor on `device`, queued without waiting. On the CPU the tensor may share
    the array's memory: pass arrays made for this call."""
    host = torch.as_tensor(values, dtype=dtype)
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


class Readback(Generic[Tree]):
    """The tensors of `tree` (any nesting of tuples, lists, dicts, named tuples) on their way to the
    host. `wait()` returns the same structure with host tensors once these copies are done: it
    waits for the work queued before the copies, not for work queued after them."""

    def __init__(self, tree: Tree, device: torch.device):
        self._event = None
        if device.type == "cpu":
            self._host = tree
            return
        self._host = tree_map_only(torch.Tensor, _pinned_copy, tree)
        self._event = torch.cuda.Event()
        self._event.record()

    def wait(self) -> Tree:
        if self._event is not None:
            self._event.synchronize()
        return self._host


def _pinned_copy(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True).copy_(tensor, non_blocking=True)
