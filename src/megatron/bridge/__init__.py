"""megatron.bridge: a training layer on megatron-core for MoE expert-parallel communication overlap.

This distribution (``moe-overlap-bridge``) uses the same import path as NVIDIA's
``megatron-bridge``; do not install both in one environment.

Importing the package quiets the warnings megatron-core and torch print while they are imported on
a machine without Transformer Engine or Apex ("Transformer Engine and Apex are not installed", a
SyntaxWarning in one of megatron-core's docstrings, torch's "No CUDA runtime is found" on a CPU
host): the start-up lines already say which layers and optimizer run. The notices megatron-core
logs on every rank of a run and that need no action ("GPTModel IS DEPRECATED", the mock dataset's
"Unable to save MockGPTDataset indexes", the rerun state machine's, the CPU smoke-mode banner that
rank 0's start-up line says once) are dropped from their loggers too. Only those messages are
filtered (``utils.quiet.KNOWN_WARNINGS`` and ``KNOWN_LOG_RECORDS``). To see them: set
``MEGATRON_BRIDGE_SHOW_IMPORT_WARNINGS=1``, run Python with any ``-W`` option (or
``PYTHONWARNINGS``), or call :func:`show_import_warnings` before importing a recipe.
"""

from megatron.bridge.utils.quiet import quiet_imports, show_import_warnings

__version__ = "0.1.0"
__all__ = ["quiet_imports", "show_import_warnings"]

quiet_imports()
