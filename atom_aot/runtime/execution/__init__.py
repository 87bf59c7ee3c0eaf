"""Running a scheduled batch on the device: step inputs, the model runner, CUDA graphs, the KV cache tensor."""
