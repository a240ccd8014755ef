"""``GPTModel`` whose language-model loss is the torch-native vocab-parallel cross-entropy.

Selected by ``cross_entropy_loss_fusion=True`` with ``cross_entropy_fusion_impl="torch_native"``
(see ``GPTModelProvider.provide``). It adds no parameters, so checkpoints are interchangeable with
megatron-core's ``GPTModel``; only ``compute_language_model_loss`` differs, which megatron-core
also calls for multi-token-prediction losses.
"""

from __future__ import annotations

from megatron.core.models.gpt import GPTModel
from torch import Tensor

from megatron.bridge.models.torch_native.cross_entropy import vocab_parallel_cross_entropy


class TorchNativeLossGPTModel(GPTModel):
    """megatron-core's ``GPTModel`` with the streaming cross-entropy of ``cross_entropy.py``."""

    def compute_language_model_loss(self, labels: Tensor, logits: Tensor) -> Tensor:
        """Per-token loss ``[b, s]`` from ``labels [b, s]`` and vocab-sharded ``logits [s, b, v]``."""
        # A plain TransformerConfig (a model built without the provider) has no such field.
        backend = getattr(self.config, "torch_native_cross_entropy_backend", "auto")
        loss = vocab_parallel_cross_entropy(logits, labels.transpose(0, 1), group=self.tp_group, backend=backend)
        return loss.transpose(0, 1).contiguous()
