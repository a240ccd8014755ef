"""The one resolution of a config (finalize), and what it hands to megatron-core: layout sizes, field ownership,
the target GPU."""
