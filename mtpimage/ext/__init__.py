"""Compiled extensions (TransformerEngine, flash-attn, apex): their recipes and wheel keys, the
builder-stage builds, the compile cache, and the wheel cache with its registry copies."""
