"""The model's forward signature, defined once: the flat inputs of one engine step, their dtypes
and their named dynamic dimensions. Export (build), the model runner and CUDA graphs (runtime)
and the model (models) all follow this table; the manifest records its version so a compiled
package is never called with another signature.

    forward(input_ids, positions, kv_cache, slot_mapping, block_tables, seq_lens, query_start_loc,
            logits_indices) -> logits [num_logits, vocab] float32
"""
from __future__ import annotations

from dataclasses import dataclass

SIGNATURE_VERSION = 1


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: str                    # "int64", "int32", or "kv" (the KV cache's dtype)
    dims: tuple[str, ...]         # a name per dimension; names in DYNAMIC_DIMS vary at run time
    doc: str


STEP_INPUTS: tuple[InputSpec, ...] = (
    InputSpec("input_ids", "int64", ("num_tokens",), "token ids of every new token, sequences back to back"),
    InputSpec("positions", "int64", ("num_tokens",), "each token's position in its sequence"),
    InputSpec("kv_cache", "kv", ("num_layers", "kv", "num_kv_blocks", "block_size", "num_kv_heads", "head_dim"),
              "the paged KV pool, written in place"),
    InputSpec("slot_mapping", "int64", ("num_tokens",), "flat KV slot per new token (-1: padding, not written)"),
    InputSpec("block_tables", "int32", ("num_seqs", "max_blocks_per_seq"), "KV blocks of each sequence"),
    InputSpec("seq_lens", "int32", ("num_seqs",), "tokens in context per sequence once this step's are written"),
    InputSpec("query_start_loc", "int32", ("num_seqs_plus_1",), "offsets of each sequence's tokens, plus the end"),
    InputSpec("logits_indices", "int64", ("num_logits",), "rows of the tokens whose logits are returned"),
)
INPUT_NAMES: tuple[str, ...] = tuple(spec.name for spec in STEP_INPUTS)

# Dimensions that vary at run time. In the decode phase num_tokens == num_logits == num_seqs.
DYNAMIC_DIMS = ("num_tokens", "num_seqs", "num_seqs_plus_1", "max_blocks_per_seq", "num_kv_blocks", "num_logits")
