"""ops/backends/base.py by_token_count: the small_m linears' branch on the token count, eager (a Python
branch) and in an exported graph (torch.cond on the symbolic M, with and without a bias operand)."""
import pytest
import torch
from torch.export import Dim

from atom_aot.ops.backends.base import by_token_count


def small(x, w, bias):
    y = x @ w.t() + 1000.0                    # tells the two sides apart
    return y if bias is None else y + bias


def large(x, w, bias):
    y = x @ w.t()
    return y if bias is None else y + bias


class Linear(torch.nn.Module):
    def __init__(self, with_bias: bool):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(6, 8), requires_grad=False)
        self.bias = torch.nn.Parameter(torch.randn(6), requires_grad=False) if with_bias else None

    def forward(self, x):
        return by_token_count(x.shape[0], 4, small, large, (x * 2, self.w), self.bias)


@pytest.mark.parametrize("with_bias", [False, True])
def test_eager_and_exported_take_the_same_side(with_bias):
    module = Linear(with_bias)
    exported = torch.export.export(module, (torch.randn(7, 8),), dynamic_shapes={"x": {0: Dim("m", min=1, max=64)}})
    assert "cond" in str(exported.graph)
    for m in (1, 4, 5, 30):
        x = torch.randn(m, 8)
        want = (small if m <= 4 else large)(x * 2, module.w, module.bias)
        with torch.no_grad():
            assert torch.allclose(module(x), want)
            assert torch.allclose(exported.module()(x), want)
