"""LazyCompiled: compile once on first use, eager after a compiler failure or when switched off."""

from __future__ import annotations

import pytest
import torch

from megatron.bridge.models.torch_native import compiled


def _double(x):
    return x * 2


def _eager(x):
    return x + 1000


def test_compiles_once_and_uses_the_compiled_function(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append(kw) or fn)
    fn = compiled.LazyCompiled(_double, "test", dynamic=True)
    assert fn(_eager, 3) == 6 and fn(_eager, 4) == 8
    assert calls == [{"dynamic": True}] and fn.enabled


def test_compiler_failure_goes_eager_for_good(monkeypatch, caplog):
    def broken(fn, **kw):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", broken)
    fn = compiled.LazyCompiled(_double, "test")
    assert fn(_eager, 3) == 1003
    assert not fn.enabled and "torch.compile failed (no compiler here)" in caplog.text
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    assert fn(_eager, 3) == 1003  # stays eager


def test_running_out_of_gpu_memory_is_not_a_compiler_failure(monkeypatch):
    """An OOM inside the compiled function is raised, and the function stays compiled."""

    def full(*args):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: full)
    fn = compiled.LazyCompiled(_double, "test")
    with pytest.raises(torch.OutOfMemoryError):
        fn(_eager, 3)
    assert fn.enabled


@pytest.fixture
def compile_switch_restored():
    """The switch is process-wide: put it back for the tests that follow."""
    yield
    compiled.set_compile_enabled(True)


@pytest.mark.parametrize("allowed", [False, True])
def test_the_process_switch_turns_compiled_paths_off_and_on(monkeypatch, compile_switch_restored, allowed):
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    fn = compiled.LazyCompiled(_double, "test")  # created before the switch, like the module-level ones
    compiled.set_compile_enabled(allowed)
    assert fn.enabled is allowed
    assert fn(_eager, 3) == (6 if allowed else 1003)


@pytest.mark.parametrize("setting", [False, True])
def test_the_provider_applies_torch_native_compile_to_the_model_it_builds(
    monkeypatch, model_parallel, compile_switch_restored, setting
):
    """``model.torch_native_compile`` is in force while the model's layers are built and after."""
    from megatron.bridge.models import gpt_provider
    from megatron.bridge.models.qwen import Qwen3MoEModelProvider

    compiled.set_compile_enabled(not setting)
    seen = {}

    class Model(torch.nn.Module):
        def __init__(self, **kwargs):
            super().__init__()
            seen["while_building"] = compiled.compile_enabled()

    monkeypatch.setattr(gpt_provider, "build_decoder_block_spec", lambda config, vp_stage=None: None)
    provider = Qwen3MoEModelProvider(vocab_size=128, layer_spec="torch_native", torch_native_compile=setting)
    monkeypatch.setattr(provider, "model_class", lambda: Model)
    provider.provide(pre_process=True, post_process=True)
    assert seen["while_building"] is setting and compiled.compile_enabled() is setting
