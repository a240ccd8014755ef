"""What every torch-native token dispatcher shares with megatron-core's alltoall dispatcher: its
interface, and what the first stage keeps of a micro-batch's input.

The torch-native dispatchers (``sorted_dispatcher.py``, ``node_aware_dispatcher.py``) subclass
megatron-core's ``MoEAlltoAllTokenDispatcher`` and implement its six stage methods
(``dispatch_preprocess``, ``token_dispatch``, ``dispatch_postprocess``, ``combine_preprocess``,
``token_combine``, ``combine_postprocess``), which the MoE layer and the combined-1F1B EP-overlap
schedule call, so ``build_schedule_plan`` keeps working.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher


class TorchNativeTokenDispatcher(MoEAlltoAllTokenDispatcher):
    """megatron-core's alltoall dispatcher's interface, for the dispatchers of this package."""

    def keep_input(self, hidden_states: torch.Tensor, routing_map: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """Keep what megatron's alltoall dispatcher keeps of the micro-batch's input (its shapes, the
        routing map and probabilities: the MoE layer and the EP-overlap schedule read them) and return
        the tokens as rows ``[tokens, hidden]``."""
        self.hidden_shape = hidden_states.shape
        self.probs = probs
        self.routing_map = routing_map
        tokens = hidden_states.view(-1, self.hidden_shape[-1])
        self.hidden_shape_before_permute = tokens.shape
        return tokens
