"""Weights read straight from a safetensors byte range: mapped on the CPU, one upload on a device."""
import json
import struct

import torch
from safetensors.torch import save

from atom_aot.runtime.safetensors_view import tensors_from_buffer, tensors_on_device


def _random_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(7, 5, generator=g).to(torch.bfloat16),
            "b.weight": torch.randn(3, 4, generator=g),
            "c.ids": torch.randint(-9, 9, (6,), generator=g, dtype=torch.int64),
            "d.empty": torch.empty(0, 4)}


def _misaligned(tensors: dict[str, torch.Tensor]) -> memoryview:
    """A file whose float32 tensor starts at an odd offset: allowed by the format, if no writer does it."""
    data, header, offset = b"", {}, 0
    parts = [("pad", torch.tensor([7], dtype=torch.uint8)), ("f", tensors["b.weight"])]
    for name, t in parts:
        raw = t.contiguous().view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": {torch.uint8: "U8", torch.float32: "F32"}[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        data, offset = data + raw, offset + len(raw)
    head = json.dumps(header).encode()
    return memoryview(struct.pack("<Q", len(head)) + head + data)


def test_mapped_tensors_equal_what_was_saved():
    tensors = _random_tensors()
    loaded = tensors_from_buffer(memoryview(save(tensors)))
    assert set(loaded) == set(tensors)
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and torch.equal(loaded[name], t)


def test_one_upload_gives_the_same_tensors():
    tensors = _random_tensors()
    uploaded = tensors_on_device(memoryview(save(tensors)), torch.device("cpu"))
    for name, t in tensors.items():
        assert uploaded[name].dtype == t.dtype and uploaded[name].shape == t.shape and torch.equal(uploaded[name], t)
    nonempty = [uploaded[n] for n in ("a.weight", "b.weight", "c.ids")]
    assert len({t.untyped_storage().data_ptr() for t in nonempty}) == 1     # views of one buffer


def test_a_misaligned_tensor_gets_its_own_copy():
    f = _random_tensors()["b.weight"]
    uploaded = tensors_on_device(_misaligned({"b.weight": f}), torch.device("cpu"))
    assert torch.equal(uploaded["f"], f) and uploaded["pad"].tolist() == [7]
