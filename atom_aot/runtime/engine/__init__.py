"""The engine core's loop at the level of token ids: intake -> schedule -> launch -> read -> update. It drives
the scheduler and a model runner through typed contracts (runtime/outputs.py), and knows nothing of text."""
