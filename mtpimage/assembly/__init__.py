"""From a Plan to a tested local image: render, the build context, the build through the engine
seam, the in-image checks (and their reuse), sizes, and the warm no-op fast path."""
