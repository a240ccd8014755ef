"""The performance harness behind ``scripts/performance/run_script.py`` and what is measured with it.

Three jobs, one package each: ``harness/`` (flags, recipe lookup, config building, launch,
supervision, results, sweeps), ``analysis/`` (reading profiler traces: hidden and exposed
dispatch/combine time, where a step's time goes) and ``benchmarks/`` (the benchmarks of
``scripts/performance/``). ``loopback_torchrun`` stays here: launch commands name it by this path.
"""
