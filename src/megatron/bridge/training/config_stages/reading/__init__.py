"""Stage 3: a config read from YAML and from dotted or Hydra-style overrides, typed against the schema."""
