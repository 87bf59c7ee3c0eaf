"""Checkpoint tensors to the runtime's own: names mapped, fused, quantized and sharded per rank, or drawn at
random (--load-format dummy). Below build and runtime, which both use it (the runtime to draw weights at load)."""
