"""Speculative decoding: proposers guess K next tokens of a running sequence, one target forward
verifies them, and the rejection sampler keeps the longest prefix the target agrees with (docs/speculative.md)."""
