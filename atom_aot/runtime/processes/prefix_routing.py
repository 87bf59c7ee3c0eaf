"""Prefix-cache-aware routing over data-parallel engines (`-dp N` replicas, or the ranks of a
data-parallel-attention artifact).

Each engine keeps its own prefix cache, so a prompt whose first blocks an engine has recently been
given is cheaper there: its prefill skips them. The router remembers, for the chained hash of each
full prompt block (the block manager's own hash, at the engines' block size), the engine last given
it, bounded and least-recently-used first out. A call goes to the engine holding its longest known
prefix unless that engine has more than `slack` requests in flight beyond the least-loaded one's;
then, and when no prefix is known, to the least-loaded engine (SGLang's cache-aware router does the
same with a radix tree and load thresholds).
"""
from __future__ import annotations

from collections import OrderedDict

from atom_aot.runtime.scheduling.block_manager import chain_hash, root_hash

ROUTINGS = ("prefix", "load")    # --dp-routing: by known prefix (this module), or to the least-loaded engine
MAX_PREFIX_BLOCKS = 256          # a prompt's first blocks hashed for routing (longer prefixes route alike)
MAX_ENTRIES = 1 << 17            # remembered block hashes, over all engines
DEFAULT_SLACK = 8                # requests in flight a cached prefix is worth over the least-loaded engine


class PrefixRouter:
    def __init__(self, num_engines: int, block_size: int, slack: int = DEFAULT_SLACK, max_entries: int = MAX_ENTRIES):
        self.num_engines = num_engines
        self.block_size = block_size
        self.slack = slack
        self.max_entries = max_entries
        self.owner: OrderedDict[int, int] = OrderedDict()    # block chain hash -> engine last given it
        self.routed_by_prefix = 0       # calls sent to their prefix's engine instead of the least-loaded one

    def block_hashes(self, token_ids: list[int], cache_salt: str | None = None) -> list[int]:
        """Chained hashes of the prompt's full blocks, as the engines' block managers compute them."""
        hashes, parent = [], root_hash(cache_salt)
        full = min(len(token_ids) // self.block_size, MAX_PREFIX_BLOCKS)
        for b in range(full):
            parent = chain_hash(token_ids[b * self.block_size:(b + 1) * self.block_size], parent)
            hashes.append(parent)
        return hashes

    def choose(self, token_ids: list[int], loads: list[int], cache_salt: str | None = None) -> int:
        """The engine for a call whose (first) prompt is `token_ids`; `loads`: requests in flight per engine."""
        least = min(range(self.num_engines), key=lambda i: loads[i])
        hashes = self.block_hashes(token_ids, cache_salt)
        holder = next((self.owner[h] for h in reversed(hashes) if h in self.owner), None)
        chosen = least
        if holder is not None and loads[holder] <= loads[least] + self.slack:
            chosen = holder
            self.routed_by_prefix += holder != least
        self._remember(hashes, chosen)
        return chosen

    def _remember(self, hashes: list[int], engine: int) -> None:
        for h in hashes:
            self.owner[h] = engine
            self.owner.move_to_end(h)
        while len(self.owner) > self.max_entries:
            self.owner.popitem(last=False)
