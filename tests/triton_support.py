"""Shared by the Triton kernel tests: the interpreter (chosen in conftest when there is no GPU)
and NaN-poisoned outputs, so an element a kernel forgot to write fails the test."""
import os

import pytest
import torch

ON_GPU = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if ON_GPU else "cpu"
pytest.importorskip("triton")

from atom_aot.ops.triton.testing import PoisonedEmpty, patch_triton_interpreter, require_interpreted_kernels  # noqa: E402

if INTERPRET:
    patch_triton_interpreter()
    require_interpreted_kernels()


@pytest.fixture(autouse=True)
def poisoned_outputs():
    """Outputs and workspaces the ops allocate start as NaN: an unwritten element fails the test."""
    with PoisonedEmpty():
        yield
