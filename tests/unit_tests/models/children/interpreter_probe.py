"""Child program: does Triton's CPU interpreter run a kernel whose loop bound is a kernel argument?

The parent sets ``TRITON_INTERPRET=1``. Every interpreted kernel of this package has such a loop.
Prints one ``REPORT {json}`` line: ``ok`` and, when the interpreter fails, its error (some Triton
releases cannot turn a scalar argument into a Python index under newer NumPy).
"""

import json

import numpy
import torch
import triton
import triton.language as tl


@triton.jit
def _copy(src, dst, n, BLOCK: tl.constexpr):
    for start in range(0, n, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        tl.store(dst + offsets, tl.load(src + offsets, mask=offsets < n), mask=offsets < n)


src, dst = torch.arange(10, dtype=torch.float32), torch.zeros(10)
report = dict(triton=triton.__version__, numpy=numpy.__version__)
try:
    _copy[(1,)](src, dst, 10, BLOCK=4)
    report.update(ok=bool(torch.equal(src, dst)), error=None)
except Exception as exc:  # the interpreter's own failure is the answer
    report.update(ok=False, error=f"{type(exc).__name__}: {exc}")
print("REPORT " + json.dumps(report), flush=True)
