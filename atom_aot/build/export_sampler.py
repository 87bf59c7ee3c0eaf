"""Export the sampler's mask thresholds (`atom_triton::sampling_threshold`, ops/sampling.py's contract) as the
artifact's `sample` package, so the runtime runs the Triton kernel without compiling it.

GPU arches only: on the CPU the sampler runs the torch reference (a sort), which needs no package. The
package has no weights; its rows and vocabulary are both dynamic (a verify step samples more rows than
sequences; the logits' width is whatever the model returns).
"""
from __future__ import annotations

import torch
from torch.export import Dim

from atom_aot.build.export import MAX_TOKENS_PER_STEP

MAX_VOCAB = 1 << 22


class SamplingThreshold(torch.nn.Module):
    def forward(self, logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                min_p: torch.Tensor) -> torch.Tensor:
        return torch.ops.atom_triton.sampling_threshold(logits, top_k, top_p, min_p)


def export_sampler(vocab_size: int, device: torch.device) -> torch.export.ExportedProgram:
    import atom_aot.ops.triton  # noqa: F401  (registers atom_triton::*)
    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(3, vocab_size, device=device, generator=g)
    example = (logits, torch.tensor([0, 5, 0], device=device), torch.tensor([1.0, 0.9, 0.5], device=device),
               torch.tensor([0.0, 0.0, 0.1], device=device))
    rows = Dim("num_rows", min=1, max=MAX_TOKENS_PER_STEP)
    vocab = Dim("vocab", min=2, max=MAX_VOCAB)
    shapes = {"logits": {0: rows, 1: vocab}, "top_k": {0: rows}, "top_p": {0: rows}, "min_p": {0: rows}}
    with torch.no_grad():
        return torch.export.export(SamplingThreshold(), example, dynamic_shapes=shapes)
