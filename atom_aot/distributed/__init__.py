"""Tensor parallelism on torch.distributed: the collectives the model's graph calls, the process
group they run on, and the worker processes of ranks 1..N-1 (rank 0 is the engine)."""
