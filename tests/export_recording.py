"""Runs an exported graph's decomposed Triton launches without launching them (the export tests' scripts).

`RecordingInterpreter` executes a graph on real CPU tensors and records each
`triton_kernel_wrapper_functional` call (kernel, grid, arguments) instead of making it.
"""
import torch
from torch.fx import Interpreter
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table, triton_kernel_wrapper_functional


def jit_function(kernel_idx):
    kernel = kernel_side_table.get_kernel(kernel_idx)
    while not hasattr(kernel, "arg_names") or not hasattr(kernel, "fn") or hasattr(kernel, "configs"):
        kernel = kernel.fn
    return kernel


def describe(kernel, grid, args):
    """A launch as plain data: kernel name, grid, and each argument (a tensor by shape, strides, dtype)."""
    def value(v):
        return [list(v.shape), list(v.stride()), str(v.dtype)] if isinstance(v, torch.Tensor) else v
    grid = [int(g) for g in grid] + [1] * (3 - len(grid))
    return {"kernel": kernel.fn.__name__, "grid": grid,
            "args": {name: value(args[name]) for name in kernel.arg_names}}


class RecordingInterpreter(Interpreter):
    """Runs the decomposed graph on real CPU tensors; kernel launches are recorded instead of made."""
    def __init__(self, gm):
        super().__init__(gm)
        self.launches = []

    def call_function(self, target, args, kwargs):
        if target is not triton_kernel_wrapper_functional:
            return super().call_function(target, args, kwargs)
        kernel = jit_function(kwargs["kernel_idx"])
        named = {**kernel_side_table.get_constant_args(kwargs["constant_args_idx"]), **kwargs["kwargs"]}
        self.launches.append(describe(kernel, kwargs["grid"][0], named))
        return {name: named[name] for name in kwargs["tensors_to_clone"]}


def launch_kinds(decomposed) -> list[tuple[str, bool]]:
    """(kernel name, whether its grid is symbolic) for each launch in a decomposed exported program."""
    launches = [n for n in decomposed.graph.nodes if n.target is triton_kernel_wrapper_functional]
    return [(jit_function(n.kwargs["kernel_idx"]).fn.__name__, any(not isinstance(g, int) for g in n.kwargs["grid"][0]))
            for n in launches]


def host_reads(decomposed) -> int:
    """Nodes that read a tensor value on the host (what .item() becomes)."""
    return sum("_local_scalar_dense" in str(n.target) for n in decomposed.graph.nodes)


def written(decomposed) -> list[list[str]]:
    """Per launch, the tensor arguments torch's mutation analysis says the kernel writes (the functional form
    copies them)."""
    return [list(n.kwargs["tensors_to_clone"]) for n in decomposed.graph.nodes
            if n.target is triton_kernel_wrapper_functional]
