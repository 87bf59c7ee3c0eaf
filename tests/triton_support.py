"""Shared by the Triton kernel tests: the interpreter (chosen in conftest when there is no GPU)
and NaN-poisoned outputs, so an element a kernel forgot to write fails the test."""
import os

import pytest
import torch

ON_GPU = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if ON_GPU else "cpu"
pytest.importorskip("triton")

from triton_kernel_checks import patch_triton_interpreter  # noqa: E402


def require_interpreted_kernels() -> None:
    """Skips the calling test module if triton or the kernels were imported before TRITON_INTERPRET=1
    was set (earlier in this process): compiled kernels cannot run on CPU tensors, and an interpreted
    kernel cannot call a compiled `tl.*` library function."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    from atom_aot.ops.triton.attention_kernels import paged_attention_kernel
    if not (isinstance(paged_attention_kernel, InterpretedFunction) and isinstance(tl.sum, InterpretedFunction)):
        pytest.skip("atom_aot.ops.triton was imported before TRITON_INTERPRET=1 was set: run these tests "
                    "in their own process", allow_module_level=True)


if INTERPRET:
    patch_triton_interpreter()
    require_interpreted_kernels()


class PoisonedEmpty:
    """Context in which torch.empty returns NaN-filled float tensors (deterministic mode's fill).

    The ops allocate their own outputs and workspaces; with this on, any element a kernel forgets
    to write stays NaN, and `rel_error` turns NaN.
    """

    def __enter__(self):
        self.prev = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
        torch.use_deterministic_algorithms(True, warn_only=True)
        return self

    def __exit__(self, *exc):
        torch.use_deterministic_algorithms(self.prev[0], warn_only=self.prev[1])


@pytest.fixture(autouse=True)
def poisoned_outputs():
    """Outputs and workspaces the ops allocate start as NaN: an unwritten element fails the test."""
    with PoisonedEmpty():
        yield
