"""The configuration of a run, filed by the stages a value passes through, in this order:

1. ``schema``: the section dataclasses beside ``training/config.py``, the allowed numeric ranges,
   and the rule record (``Rule``, ``RuleContext``, reading a dotted field) every later stage uses.
2. ``facts``: what follows from the declared values without judging them: the parallel layout, the
   GPU catalogue, the overlap switches and how ``null`` is decided, which field owns which copy,
   the memory estimate.
3. ``reading``: a config from YAML and from dotted or Hydra-style overrides, typed against the
   schema (the ownership table of ``facts`` refuses a write to a copy).
4. ``rules``: every prerequisite as a rule record, and the one registry of them.
5. ``resolution``: the one resolution of a container (effective values, the checks, the copies
   written for megatron-core), the overlap report, upstream's ``finalize()``/``setup()`` and the
   generated overlap docs.

A module imports only from its own stage or an earlier one (``tests/unit_tests/training/
test_config_stage_order.py`` checks it, function-level imports included). The public modules
(``training/config.py``, ``comm_overlap.py``, ``flex_dispatcher_backend.py``, ``pretrain.py``,
``utils/omegaconf_utils.py``) sit above every stage: they may call any of them, none imports them
at run time. The topic of a module is in its name (``overlap_fields``, ``overlap_rules``, ...).
"""
