"""The MTP image builder: YAML manifests -> resolved Plan -> tested CUDA images."""

__version__ = "0.1.0"
