"""Registries: image references, the registry HTTP API with docker's stored logins, the push,
verify and move of tags with its roll-back, and the SBOM attached to a pushed image."""
