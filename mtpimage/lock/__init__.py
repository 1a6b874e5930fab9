"""`lock`: every pin verified, the Python environment resolved once with uv, the pinned git
sources fetched and probed, and manifests/lock.yaml written and read (`--frozen`)."""
