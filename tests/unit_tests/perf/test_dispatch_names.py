"""The harness reads the dispatch paths' names from the registry's source (``-h`` and a refused
``--moe_flex_dispatcher_backend`` answer without megatron-core); what it reads is what the registry
holds, and where the source cannot say, the registry answers itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron.bridge.models.dispatch.path_registry import DISPATCH_PATHS, flex_backends
from megatron.bridge.perf.harness import dispatch_names
from megatron.bridge.perf.harness.argument_parser import parse_args


def test_the_names_read_from_source_are_the_registry_s():
    assert dispatch_names.paths_from_source() == [(p.name, p.kind) for p in DISPATCH_PATHS]
    assert dispatch_names.flex_backend_names() == flex_backends()


@pytest.mark.parametrize(
    "registry", ["DISPATCH_PATHS = tuple(PATHS)\n", "this is not python ("], ids=["not-written-out", "unreadable"]
)
def test_a_registry_the_source_cannot_answer_for_is_imported(tmp_path: Path, monkeypatch, registry):
    (tmp_path / "path_registry.py").write_text(registry)
    monkeypatch.setattr(dispatch_names, "_package_dir", lambda: tmp_path)
    assert dispatch_names.paths_from_source() is None
    assert dispatch_names.flex_backend_names() == flex_backends()


@pytest.mark.parametrize("backend", flex_backends())
def test_the_flag_takes_every_flex_backend_of_the_registry(backend):
    args = parse_args(["-mr", "qwen3_moe_tiny", "--moe_flex_dispatcher_backend", backend])
    assert args.moe_flex_dispatcher_backend == backend
