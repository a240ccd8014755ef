#!/usr/bin/env python
"""Exposed vs hidden MoE dispatch/combine time from torch profiler traces.

Usage: uv run python scripts/performance/analyze_overlap.py TRACE.json [TRACE2.json ...] [--ep 16]
       [--threshold 0.05] [--no-sendrecv] [--cpu-ops|--no-cpu-ops] [--json OUT.json]

The logic lives in ``megatron.bridge.perf.analysis.overlap_analysis``.
"""

from __future__ import annotations

import sys

from megatron.bridge.perf.analysis.overlap_analysis_cli import main

if __name__ == "__main__":
    sys.exit(main())
