"""Weights read straight from a safetensors byte range: mapped on the CPU, one upload on a device."""
import json
import struct

import pytest
import torch
from safetensors.torch import save

from atom_aot.runtime.loading import safetensors_view
from atom_aot.runtime.loading.safetensors_view import tensors_from_buffer, tensors_on_device


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


def _fp8_layer_file() -> tuple[dict[str, torch.Tensor], memoryview]:
    """As an FP8 artifact lays them out: an 8-byte tensor ([2] float32 KV scales) before the weights."""
    g = torch.Generator().manual_seed(1)
    tensors = {**_random_tensors(), "l0.kv_scale": torch.rand(2, generator=g),
               "l0.w": (torch.randn(64, 48, generator=g) * 8).to(torch.float8_e4m3fn),
               "l0.w_scale": torch.rand(64, generator=g), "l1.kv_scale": torch.rand(2, generator=g)}
    return tensors, memoryview(save(tensors))


@pytest.mark.parametrize("staging_bytes", [1 << 20, 512])
def test_the_upload_gives_the_same_tensors_each_at_an_aligned_place(staging_bytes, monkeypatch):
    monkeypatch.setattr(safetensors_view, "STAGING_BYTES", staging_bytes)    # 512: big ones go up alone
    tensors, buffer = _fp8_layer_file()
    header, _ = safetensors_view._header(buffer)
    assert any(info["data_offsets"][0] % 16 for info in header.values())   # the file itself is misaligned
    uploaded = tensors_on_device(buffer, torch.device("cpu"))
    for name, t in tensors.items():
        assert uploaded[name].dtype == t.dtype and uploaded[name].shape == t.shape
        assert torch.equal(uploaded[name].view(torch.uint8), t.view(torch.uint8)), name
    nonempty = [uploaded[n] for n in tensors if tensors[n].numel()]
    start = nonempty[0].untyped_storage().data_ptr()
    assert {t.untyped_storage().data_ptr() for t in nonempty} == {start}     # views of one buffer
    assert all((t.data_ptr() - start) % safetensors_view.ALIGN == 0 for t in nonempty)


def test_a_tensor_at_an_odd_offset_uploads_intact():
    f = _random_tensors()["b.weight"]
    uploaded = tensors_on_device(_misaligned({"b.weight": f}), torch.device("cpu"))
    assert torch.equal(uploaded["f"], f) and uploaded["pad"].tolist() == [7]
