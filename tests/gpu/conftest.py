"""GPU tests: every test here is marked ``gpu`` and skipped, with the reason, where no CUDA GPU is
visible (CPU CI collects and skips them). ``scripts/gpu_test_lane.py`` runs them with the unit suite
on a GPU machine, with and without Transformer Engine."""

from __future__ import annotations

import pytest
import torch

from megatron.bridge.utils.import_utils import describe_transformer_engine, have_transformer_engine


def pytest_collection_modifyitems(config, items):
    here = str(config.rootpath / "tests" / "gpu")
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (none visible)")
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(no_gpu)


@pytest.fixture
def needs_te() -> None:
    """Skips the test where Transformer Engine does not import."""
    if not have_transformer_engine():
        pytest.skip(f"needs Transformer Engine (here: {describe_transformer_engine()})")


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(0)
