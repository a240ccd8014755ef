"""Under EP overlap, the final layernorm's gradients (made on the communication stream) are recorded
for the stream that accumulates them, before DDP can drop them; nothing is registered otherwise."""

from __future__ import annotations

import pytest
import torch

from megatron.bridge.models import comm_stream_grads


class _Decoder(torch.nn.Module):
    def __init__(self, hidden: int, final_norm: bool) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(hidden, hidden, bias=False)
        self.final_layernorm = torch.nn.RMSNorm(hidden) if final_norm else None


class _Model(torch.nn.Module):
    """The two things the hook registration reads: ``decoder.final_layernorm`` and parameters."""

    def __init__(self, final_norm: bool = True, **_ignored) -> None:
        super().__init__()
        self.decoder = _Decoder(8, final_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.decoder.layer(x)
        norm = self.decoder.final_layernorm
        return norm(out) if norm is not None else out


@pytest.fixture
def recorded(monkeypatch):
    """The gradients the hook hands to ``record_on_current_stream`` (CPU tensors: nothing to record)."""
    seen: list[torch.Tensor] = []
    monkeypatch.setattr(comm_stream_grads, "record_on_current_stream", seen.append)
    return seen


def _provided(monkeypatch, overlap: bool, final_norm: bool = True) -> torch.nn.Module:
    """A model through ``GPTModelProvider.provide()``, the real place the hooks are registered."""
    from megatron.bridge.models import gpt_provider
    from megatron.bridge.models.qwen import Qwen3MoEModelProvider

    monkeypatch.setattr(gpt_provider, "build_decoder_block_spec", lambda config, vp_stage=None: None)
    provider = Qwen3MoEModelProvider(vocab_size=128, layer_spec="local", overlap_moe_expert_parallel_comm=overlap)
    monkeypatch.setattr(provider, "model_class", lambda: lambda **kw: _Model(final_norm=final_norm))
    return provider.provide(pre_process=True, post_process=True)


@pytest.mark.parametrize("micro_batches", [1, 3])
def test_every_final_norm_gradient_is_recorded_under_ep_overlap(monkeypatch, recorded, micro_batches):
    model = _provided(monkeypatch, overlap=True)
    for _ in range(micro_batches):
        model(torch.randn(4, 8)).sum().backward()
    weight = model.decoder.final_layernorm.weight
    assert len(recorded) == micro_batches  # one incoming gradient per backward, the norm weight's only
    assert all(g.shape == weight.shape for g in recorded)
    assert torch.allclose(sum(recorded), weight.grad)  # the very gradients that were accumulated


@pytest.mark.parametrize("overlap, final_norm", [(False, True), (True, False)])
def test_nothing_is_registered_without_overlap_or_final_norm(monkeypatch, recorded, overlap, final_norm):
    model = _provided(monkeypatch, overlap=overlap, final_norm=final_norm)
    model(torch.randn(4, 8)).sum().backward()
    assert recorded == []


def test_only_the_final_norm_parameters_are_hooked():
    model = _Model()
    assert comm_stream_grads.params_with_grads_on_comm_stream(model) == [model.decoder.final_layernorm.weight]
    assert comm_stream_grads.keep_comm_stream_grads_for_accumulation(model) == 1


def test_cpu_gradients_are_left_alone():
    comm_stream_grads.record_on_current_stream(torch.ones(3))  # no CUDA: nothing to record, no error
