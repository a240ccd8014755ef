"""The dispatch paths: how an MoE layer's tokens reach their experts' GPUs, one module per path and
the registry that lists them (``path_registry.py``). See ``dispatch_path.py`` for what a path says
about itself and ``docs/extending.md`` for adding one."""
