"""The engine's decisions, in plain Python (no torch): the scheduler (which tokens each step computes, within
its budget; preemption), the paged KV block manager with prefix caching, and the per-request Sequence."""
