"""Put first on ``PYTHONPATH`` by a test: the training ranks make one value non-finite at a chosen
iteration, so the test asserts what a run does about it whatever the machine's arithmetic (when a huge
learning rate diverges depends on the CPU's reduction order).

``BRIDGE_TEST_NONFINITE=loss:4``: the loss of iteration 4 is NaN (the parameters stay finite).
``BRIDGE_TEST_NONFINITE=parameters:2``: iteration 2's update leaves a NaN in one parameter, while the
loss of that step, computed before the update, is finite.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

MODULE = "megatron.bridge.training.pretrain"
WHAT, _, AT = os.environ.get("BRIDGE_TEST_NONFINITE", "").partition(":")


def _poison(trainer_class: type, what: str, iteration: int) -> None:
    import torch

    step = trainer_class._forward_backward_and_update

    def poisoned(self):
        losses_reduced, grad_norm = step(self)
        if self.state.iteration + 1 == iteration:  # the step being run
            if what == "loss":
                losses_reduced = [
                    {**item, "lm loss": item["lm loss"] * float("nan")} if "lm loss" in item else item
                    for item in losses_reduced
                ]
            else:
                with torch.no_grad():
                    next(self.model[0].parameters()).view(-1)[0] = float("nan")
        return losses_reduced, grad_norm

    trainer_class._forward_backward_and_update = poisoned


class _PoisonAfterImport(importlib.abc.MetaPathFinder):
    """Lets the training module load as usual, then wraps its trainer's step."""

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        finders = (f for f in sys.meta_path if f is not self and hasattr(f, "find_spec"))
        spec = next(filter(None, (f.find_spec(name, path, target) for f in finders)), None)
        if spec is None:
            return None
        execute = spec.loader.exec_module

        def execute_and_poison(module):
            execute(module)
            _poison(module.Trainer, WHAT, int(AT))

        spec.loader.exec_module = execute_and_poison
        return spec


if WHAT in ("loss", "parameters") and AT.isdigit():
    sys.meta_path.insert(0, _PoisonAfterImport())
