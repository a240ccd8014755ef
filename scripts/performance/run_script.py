#!/usr/bin/env python
"""Performance harness: familiar flags + dotted overrides, dry run, launch, results, sweeps.

Example (EP overlap on 16 H100s; add --dryrun on a machine without GPUs):

    uv run python scripts/performance/run_script.py -m qwen -mr qwen3_30b_a3b --task pretrain \\
        -g h100 -c bf16 -ng 16 -gn 8 --max_steps 8 --cuda_graph_impl none \\
        --moe_flex_dispatcher_backend None --moe_a2a_overlap false --tokenizer_type NullTokenizer \\
        comm_overlap.overlap_moe_expert_parallel_comm=true comm_overlap.delay_wgrad_compute=false \\
        model.moe_shared_expert_overlap=false

Precedence: recipe < --config_file < flags < dotted overrides. See docs/performance/harness.md.
The logic lives in ``megatron.bridge.perf``.
"""

from __future__ import annotations

import sys

from megatron.bridge.utils.quiet import silence_harness_noise

# megatron-core warns at import time about optional packages (TE, Apex, absl); not actionable here.
silence_harness_noise()

from megatron.bridge.perf.harness.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
