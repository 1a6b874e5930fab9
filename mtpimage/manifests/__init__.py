"""What users write, loaded and checked: the component catalogue and the profiles (YAML with
line numbers, JSON Schemas), the MTP modes, the compatibility rules and the pinned patches."""
