"""The performance harness behind ``scripts/performance/run_script.py``.

Each step lives in its own importable module so it can be unit-tested without launching anything:
``argument_parser`` (flags), ``recipe_lookup`` (``-m/-mr/--task`` to a recipe), ``config_builder``
(recipe < ``--config_file`` < flags < dotted overrides), ``launcher`` (torchrun/srun/sbatch),
``results`` (steady-state table), ``sweep`` (one-knob A/B runs) and ``overlap_analysis``
(exposed dispatch/combine time from a profiler trace).
"""
