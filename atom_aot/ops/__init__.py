"""Operators the models call. Importing this package registers the `atom::` custom ops, which must
happen before a compiled model that calls them is loaded."""
from atom_aot.ops.attention import paged_attention  # noqa: F401  (registers atom::paged_attention)
from atom_aot.ops.fp8 import fp8_linear  # noqa: F401  (registers atom::fp8_linear)
from atom_aot.ops.int4 import int4_linear  # noqa: F401  (registers atom::int4_linear)
from atom_aot.ops.int8 import int8_linear  # noqa: F401  (registers atom::int8_linear)
from atom_aot.ops.moe import fused_moe  # noqa: F401  (registers atom::fused_moe)
