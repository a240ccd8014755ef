"""Section dataclasses beside ``training/config.py`` (``CommOverlapConfig`` and Megatron-Bridge's
upstream sections) and ``copy_records``, which remembers the copies a resolution wrote."""
