"""Build step: read a checkpoint, shard/fuse/quantize it, and write the artifact."""
