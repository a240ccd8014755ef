"""megatron.bridge: a training layer on megatron-core for MoE expert-parallel communication overlap.

This distribution (``moe-overlap-bridge``) uses the same import path as NVIDIA's
``megatron-bridge``; do not install both in one environment.
"""

__version__ = "0.1.0"
