"""Weights drawn at load (`atom-build --load-format dummy-at-load`): the artifact stores none of the
model's weights, only what a draw cannot reproduce (weights/random_draw.py `stored_at_load`, e.g. calibrated
KV scales). The rank's weights are drawn on its device through the build's own functions
(weights/random_draw.py `draw_rank_state`: draw -> convert -> shard), then the stored tensors replace theirs.

This is the one runtime module that imports build/ (tests/test_layering.py names it): a draw at load
is the build's conversion run at load, so it must be that code, not a copy that could drift from it.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from atom_aot.artifact.layout import CONFIG
from atom_aot.artifact.reader import Artifact
from atom_aot.dtypes import torch_dtype
from atom_aot.errors import ArtifactError
from atom_aot.models.parallel import Split
from atom_aot.weights.random_draw import draw_rank_state, recorded_draw_order

log = logging.getLogger("atom_aot")


def draw_artifact_weights(artifact: Artifact, rank: int, device: torch.device, stored: dict[str, torch.Tensor],
                          metadata: dict[str, str]) -> dict[str, torch.Tensor]:
    """Rank `rank`'s weights of a dummy-at-load artifact, drawn as its manifest says it was built, in the
    order its weights file's `metadata` records (weights/random_draw.py draw_order_metadata)."""
    m = artifact.manifest
    config_dir = artifact.member_dir(Path(CONFIG).parent.name)       # config.json, as the build read it
    shapes = recorded_draw_order(metadata)
    if shapes is None:
        log.info("weights drawn at load: this artifact does not record its draw order (built by an older atom-build), "
                 "so transformers lists the parameters (seconds of import and a meta model)")
    return draw_weights(config_dir, torch_dtype(m.numerics.dtype), m.quantization.weights,
                        m.numerics.max_model_len, Split.of(m.layout), rank, device, stored, shapes)


def draw_weights(config_dir: Path, dtype: torch.dtype, quant: str, max_model_len: int, split: Split, rank: int,
                 device: torch.device, stored: dict[str, torch.Tensor],
                 shapes: dict[str, torch.Size] | None = None) -> dict[str, torch.Tensor]:
    """The drawn weights (of `shapes`, the recorded draw order; transformers' when None) with the `stored`
    tensors in their places; a stored name the draw does not make is refused (the artifact and this
    atom-aot disagree on the model)."""
    start = time.perf_counter()
    weights = draw_rank_state(config_dir, dtype, quant, max_model_len, split, rank, device, shapes)
    unlike = sorted(n for n, t in stored.items()
                    if n not in weights or (weights[n].shape, weights[n].dtype) != (t.shape, t.dtype))
    if unlike:
        raise ArtifactError(f"the artifact stores {unlike[:3]}, which the weights drawn at load do not have (or not "
                            f"of that shape and dtype): it does not match this atom-aot's model. Rebuild it with "
                            f"atom-build.")
    weights.update({name: tensor.to(device) for name, tensor in stored.items()})
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    gib = sum(t.numel() * t.element_size() for t in weights.values()) / 2**30
    log.info("weights drawn at load (--load-format dummy-at-load): %.2f GiB in %.1f s", gib,
             time.perf_counter() - start)
    return weights
