"""Tokenizing off the event loop: encoding a prompt of megabytes takes the Rust tokenizer seconds,
and on the loop those seconds would stall every other request and /health. Two threads: the fast
tokenizer releases the GIL while it encodes (runtime/text/fast_tokenizer.py), but takes it back to hand
over the token ids, and the more threads finish together, the longer the loop waits for it (eight
3.9 MB prompts on 2 cores: the loop's longest wait was 0.1 s with one thread, 0.16 s with two,
0.5 s with four, while two finished them 26% sooner than one and four no sooner than two)."""
from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")

TOKENIZER_THREADS = 2


def tokenizer_pool() -> ThreadPoolExecutor:
    """A server's pool (its threads start on first use and end with the process)."""
    return ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="atom-tokenize")


async def off_loop(pool: ThreadPoolExecutor, fn: Callable[..., T], *args, **kwargs) -> T:
    """`fn(*args, **kwargs)` on one of `pool`'s threads; its exception is raised here."""
    return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, *args, **kwargs))
