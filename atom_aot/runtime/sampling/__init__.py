"""From logits to tokens: SamplingParams, the sampler, logits processors and structured outputs (grammars)."""
