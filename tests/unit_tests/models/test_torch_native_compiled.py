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


@pytest.mark.parametrize("value, enabled", [("0", False), ("1", True)])
def test_environment_switch(monkeypatch, value, enabled):
    monkeypatch.setenv("MBRIDGE_TORCH_NATIVE_COMPILE", value)
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    fn = compiled.LazyCompiled(_double, "test")
    assert fn.enabled is enabled
    assert fn(_eager, 3) == (6 if enabled else 1003)
