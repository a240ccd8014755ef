"""Communication-overlap configuration, one job per module.

``fields`` (the switches and their computed defaults), ``resolution`` (effective values and their
sources), ``facts`` (what the rules read besides the switches), ``rules`` (the prerequisites),
``lifecycle`` (upstream's ``finalize()``/``setup()``), ``report`` (the start-up report) and ``docs``
(the generated docs page). Users import ``CommOverlapConfig`` and the names they need from
``megatron.bridge.training.comm_overlap``.
"""
