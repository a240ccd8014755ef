"""The harness behind ``scripts/performance/run_script.py``, one job per module so each is tested
without launching anything: ``argument_parser`` (flags), ``recipe_lookup`` (``-m/-mr/--task`` to a
recipe), ``config_builder`` (recipe < ``--config_file`` < flags < dotted overrides), ``run`` (the
main flow), ``launcher`` (torchrun/srun/sbatch), ``supervisor`` (a launch to its end),
``failure_report`` and ``stop_report`` (what ended a job), ``results`` (the steady-state table) and
``sweep`` (one-knob A/B runs). It reaches the training side only through
``training/harness_surface.py``."""
