"""Text in and out: the artifact's tokenizer, incremental detokenization, stop strings and timings."""
