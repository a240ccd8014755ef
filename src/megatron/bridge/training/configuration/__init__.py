"""Section dataclasses beside ``training/config.py`` (Megatron-Bridge's upstream sections)."""
