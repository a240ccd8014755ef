"""A stand-in for a launcher with one profiled CPU rank: prints, with torchrun's rank prefix, the
lines torch's profiler library (kineto) writes straight to a rank's stderr on a host without a CUDA
driver, between a rank's own lines.

    profiled_cpu_rank.py
"""

import os
import sys

print("[default0]:[megatron.bridge] profiling iterations 2-2 on rank 0", flush=True)
for line in (
    "[default0]:USDT:2026-01-01 00:00:00 100:100 SyncActivityProfilerHandler.cpp:39] profiler_start",
    "[default0]:ERROR:2026-01-01 00:00:00 100:100 DeviceProperties.cpp:56] gpuGetDeviceCount failed with code 35",
    "[default0]:USDT:2026-01-01 00:00:00 100:100 SyncActivityProfilerHandler.cpp:46] profiler_stop",
):
    os.write(2, (line + "\n").encode())  # past Python, as the native library writes
print("[default0]:iteration      2/2 | loss 1.0", flush=True)
sys.exit(0)
