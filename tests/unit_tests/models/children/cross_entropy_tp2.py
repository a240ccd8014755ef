"""Child program (two ranks, gloo on CPU): the torch-native cross-entropy's Triton kernels (through
Triton's interpreter) against its PyTorch path, and the vocab-parallel loss across two
tensor-parallel ranks; prints one ``REPORT {json}`` line per rank. argv: RANK PORT.
``CROSS_ENTROPY_CHILD_TRITON=0`` leaves the Triton kernels out (an interpreter that cannot run here).
"""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
import torch
import torch.distributed as dist
from child_exit import finish  # beside this program

from megatron.bridge.models.torch_native import cross_entropy as ce

rank, port = int(sys.argv[1]), sys.argv[2]
TRITON = os.environ.get("CROSS_ENTROPY_CHILD_TRITON", "1") == "1"
dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}")


def loss_and_grad(logits, target, weight, **kwargs):
    x = logits.clone().requires_grad_()
    loss = ce.vocab_parallel_cross_entropy(x, target, **kwargs)
    (loss * weight).sum().backward()
    return loss.detach(), x.grad


def case(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(4, 3, vocab, generator=g) * 4,
        torch.randint(0, vocab, (4, 3), generator=g),
        torch.randn(4, 3, generator=g),
    )


def triton_cases() -> dict:
    """The interpreted kernels against the PyTorch path, also on rows that are not adjacent."""
    out = {"interpreted": {}}
    for vocab in (300, 9000):
        logits, target, weight = case(vocab, vocab)
        (lt, gt), (lk, gk) = (loss_and_grad(logits, target, weight, backend=b) for b in ("torch", "triton"))
        out["interpreted"][str(vocab)] = {
            "picked": ce.select_backend(logits.device.type),
            "loss_diff": float((lt - lk).abs().max()),
            "grad_diff": float((gt - gk).abs().max()),
            "grad_scale": float(gt.abs().max()),
        }
    # Rows that are not adjacent in memory (a column slice of a wider tensor): same loss and gradient.
    logits, target, weight = case(300, 3)
    wide = torch.cat([logits, torch.randn(4, 3, 40)], dim=-1).requires_grad_()
    sliced = ce.vocab_parallel_cross_entropy(wide[..., :300], target, backend="triton")
    (sliced * weight).sum().backward()
    dense_loss, dense_grad = loss_and_grad(logits, target, weight, backend="triton")
    out["strided_rows"] = {
        "loss_diff": float((sliced.detach() - dense_loss).abs().max()),
        "grad_diff": float((wide.grad[..., :300] - dense_grad).abs().max()),
        "grad_outside": float(wide.grad[..., 300:].abs().max()),
    }
    return out


report = {"tensor_parallel": {}, **(triton_cases() if TRITON else {})}
vocab, shard = 1000, 500
logits, target, weight = case(vocab, 0)
ref_loss, ref_grad = loss_and_grad(logits, target, weight, backend="torch")
mine = logits[..., rank * shard : (rank + 1) * shard]
for backend in ("torch", "triton") if TRITON else ("torch",):
    loss, grad = loss_and_grad(mine, target, weight, group=dist.group.WORLD, backend=backend)
    report["tensor_parallel"][backend] = {
        "loss_diff": float((loss - ref_loss).abs().max()),
        "grad_diff": float((grad - ref_grad[..., rank * shard : (rank + 1) * shard]).abs().max()),
    }
report["targets_on_this_shard"] = int(((target >= rank * shard) & (target < (rank + 1) * shard)).sum())
finish(report)
