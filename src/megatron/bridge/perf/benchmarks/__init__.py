"""The benchmarks behind ``scripts/performance/``: cases built as harness command lines and trained
one after another (``benchmark_jobs``), EP overlap in an emulated cluster (``emulation_benchmark``),
the inter-node bytes of the dispatchers (``inter_node_bytes``) and how long the harness takes to
answer (``start_times``). Each plans and records; the harness builds and validates every case."""
