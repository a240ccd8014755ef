"""GPU check: the unpermutation's gather-sum kernel against torch's gather then sum, bf16, proxy shapes.

One GPU: ``python tests/gpu_checks/gather_sum_kernel.py``. For 4,096 and 8,192 tokens (MBS 1 and 2 of
the Qwen3-30B-A3B proxy), top-8, hidden 2048: whether the two agree bit for bit, how many elements
differ and by how much, and the time of each (``triton.testing.do_bench``).
"""

import torch
from triton.testing import do_bench

from megatron.bridge.models.torch_native.row_gather import gather_sum_rows

for T in (4096, 8192):
    k, H = 8, 2048
    rows = torch.randn(T * k, H, device="cuda", dtype=torch.bfloat16)
    pos = torch.randperm(T * k, device="cuda").view(T, k)
    ref = rows.index_select(0, pos.reshape(-1)).view(T, k, H).sum(1)
    got = gather_sum_rows(rows, pos)
    diff = (got.float() - ref.float()).abs()
    print(T, "bitwise_equal", torch.equal(got, ref), "differing", int((diff > 0).sum()), "max", float(diff.max()))
    t_ref = do_bench(lambda: rows.index_select(0, pos.reshape(-1)).view(T, k, H).sum(1))
    t_k = do_bench(lambda: gather_sum_rows(rows, pos))
    print(T, f"torch gather+sum {t_ref * 1e3:.0f} us, kernel {t_k * 1e3:.0f} us")
