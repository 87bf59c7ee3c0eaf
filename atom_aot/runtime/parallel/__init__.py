"""Several ranks of one engine: tensor-parallel rank processes led by rank 0, data-parallel attention."""
