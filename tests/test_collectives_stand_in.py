"""The one-process stand-in for a tensor-parallel world (the build's CUDA-graph memory probe runs a
rank's graph on the one GPU the build has): collectives keep a rank's shapes, with no other rank."""
import pytest
import torch

from atom_aot.distributed import collectives


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(collectives, "_groups", {})       # restored after the test
    collectives.register_stand_in()


def test_all_reduce_gives_a_new_tensor_equal_to_its_input(stand_in):
    x = torch.randn(5, 8)
    out = collectives.all_reduce(x)
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()


def test_all_gather_gives_every_rank_columns_of_the_rank_shape(stand_in):
    x = torch.randn(3, 4)
    out = collectives.all_gather_columns(x, 2)
    assert out.shape == (3, 8) and torch.equal(out[:, :4], x) and torch.equal(out[:, 4:], x)


def test_without_a_group_or_stand_in_a_collective_says_what_is_missing(monkeypatch):
    monkeypatch.setattr(collectives, "_groups", {})
    with pytest.raises(RuntimeError, match="before its process group was registered"):
        collectives.all_reduce(torch.randn(2))
