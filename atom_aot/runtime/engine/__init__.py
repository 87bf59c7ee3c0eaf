"""The engine's decisions at the level of token ids: the core loop (intake -> schedule -> launch -> read ->
update), the scheduler, the KV block manager and the per-request Sequence. No torch below engine_core."""
