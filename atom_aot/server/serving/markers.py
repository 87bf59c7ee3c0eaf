"""What the output parsers share about markers in a growing text."""
from __future__ import annotations


def held_prefix(text: str, marker: str) -> int:
    """Length of the longest end of `text` that begins `marker` (it may be the marker's first half): what a stream
    holds back until the next piece tells."""
    return next((n for n in range(min(len(marker) - 1, len(text)), 0, -1) if marker.startswith(text[-n:])), 0)
