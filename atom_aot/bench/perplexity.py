"""Perplexity of an artifact on a fixed text: one teacher-forced prefill through the runtime's own
forward (load_artifact), next-token cross entropy over every position. Used to measure what FP8
weights and an FP8 KV cache cost in quality (scripts/cpu_smollm2_fp8_perplexity.py)."""
from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from atom_aot.artifact.phase import Phase
from atom_aot.dtypes import torch_dtype
from atom_aot.runtime.loading.loader import load_artifact
from atom_aot.weights.kv_scales import prefill_inputs

# Plain English prose written for this benchmark (no dataset download); ~420 tokens for SmolLM2's tokenizer.
TEXT = (
    "The lighthouse at the end of the harbour was built in 1871, after a winter storm drove three fishing boats "
    "onto the rocks below the cliff. For the first forty years its lamp burned whale oil, and the keeper climbed "
    "the one hundred and twelve steps every four hours to trim the wick and wind the clockwork that turned the "
    "lens. The keeper's daughter kept a logbook of every ship that passed, noting its name, its flag and the "
    "weather, and the town library still holds the eleven volumes she filled.\n\n"
    "In 1913 the oil lamp was replaced by an electric bulb, and a cable was laid along the sea wall to bring power "
    "from the new station in the valley. The keeper stayed on, because the cable failed often in the first years "
    "and someone had to light the reserve lamp when it did. By the 1950s the light ran on its own, and the last "
    "keeper left in 1962. The cottage beside the tower became a small museum, with the old lens in the front room "
    "and the logbooks in a glass case by the window.\n\n"
    "Today most ships find their way with satellite navigation, and the light is kept burning mainly out of habit "
    "and affection. Visitors walk up from the harbour on summer evenings to watch the beam sweep across the water. "
    "Children count the seconds between flashes, which has been four since the day the lamp was first lit, and "
    "the older people in the town say that they can tell the time of night by the colour of the sea under it. "
    "Each spring the volunteers who look after the museum repaint the tower white and red, and each autumn they "
    "check the glass for cracks before the storms arrive.\n\n"
    "There is a story, told in the harbour pub, that the keeper's daughter saw a ship with no name one night in "
    "1889, sailing without lights against the wind. She wrote it down in her careful hand, with the time and the "
    "direction, and underlined it twice. Nobody else saw it, and no ship was reported missing that year. Some "
    "people say she dreamed it; others point out that she never wrote down anything she had not seen herself."
)


def perplexity(artifact: str | Path, max_tokens: int | None = None) -> tuple[float, int]:
    """(perplexity of TEXT's first max_tokens tokens, tokens scored) for one artifact."""
    from transformers import AutoTokenizer
    loaded = load_artifact(artifact)
    ids = AutoTokenizer.from_pretrained(str(loaded.tokenizer_dir)).encode(TEXT)[:max_tokens]
    inputs = prefill_inputs(loaded.model_config, [ids], torch_dtype(loaded.kv_cache.dtype), loaded.device, loaded.block_size,
                            logits="all")
    with torch.no_grad():
        logits = loaded.forwards[Phase.MIXED](inputs)                    # [N, vocab] float32
    nll = F.cross_entropy(logits[:-1].float(), torch.tensor(ids[1:], device=logits.device))
    return math.exp(nll.item()), len(ids) - 1
