"""Decisions made before launch read the machine through one object, and unit tests describe it.

Validation, resolution, the recipes and the harness's planning ask ``utils/host.py``'s
``current_host()`` for GPU, memory and package facts; none of their modules reads the machine itself
(``torch.cuda`` queries, ``nvidia-smi``, ``sysconf``, importing an optional package to see whether it is
there). That is what lets a unit test state its machine (``tests/simulated_hosts.py``) and get the same
verdict on a CPU laptop and on a GPU node, and a login node validate for the cluster's GPUs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from simulated_hosts import RealHostRead

from megatron.bridge.utils import host as host_module

SRC = Path(__file__).resolve().parents[2] / "src" / "megatron" / "bridge"

DECIDES_BEFORE_LAUNCH = (
    "training/config_stages",
    "recipes",
    "perf_recipes",
    "perf",
    "training/config.py",
    "training/comm_overlap.py",
    "training/mixed_precision.py",
    "training/flex_dispatcher_backend.py",
    "models/layer_specs.py",
    "models/gpt_provider.py",
    "utils/import_utils.py",
    "utils/gpu_count.py",
)
"""Modules whose answers must not depend on the machine they run on, except through ``current_host()``."""

MACHINE_READS = re.compile(
    r"torch\.cuda\.(?:is_available|device_count|get_device_name|get_device_capability|get_device_properties"
    r"|mem_get_info)\b|nvidia-smi|os\.sysconf|/sys/fs/cgroup|find_spec\(\s*[\"'](?:deep_ep|transformer_engine)"
    r"|^\s*(?:import|from)\s+(?:transformer_engine|deep_ep)\b",
    re.MULTILINE,
)

ALLOWED: dict[str, str] = {
    "perf/benchmarks/benchmark_jobs.py": "names the GPUs and the host a benchmark measured on, where it ran",
    "training/flex_dispatcher_backend.py": "upstream's helper asks torch for the GPU's properties once, after the "
    "host counted a GPU it could not identify, to raise FlexGpuProbeError instead of guessing",
}
"""Reads that are about the machine that runs, with the reason each is not a decision before launch."""


def _modules() -> list[Path]:
    found = []
    for entry in DECIDES_BEFORE_LAUNCH:
        path = SRC / entry
        found += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_decisions_before_launch_read_the_machine_only_through_current_host(path: Path) -> None:
    reads = MACHINE_READS.findall(path.read_text())
    if str(path.relative_to(SRC)) in ALLOWED:
        return
    assert not reads, f"{path.relative_to(SRC)} reads the machine itself ({reads}): ask current_host() instead"


def test_the_allowed_reads_are_still_there() -> None:
    """An allowance whose read is gone is removed too, so the list says what is true."""
    for name in ALLOWED:
        assert MACHINE_READS.search((SRC / name).read_text()), f"{name} no longer reads the machine"


@pytest.mark.parametrize(
    "fact, args",
    [("gpu", ()), ("gpu_count", ()), ("memory_bytes", ()), ("te_version", ()), ("has_package", ("deep_ep",))],
)
def test_a_unit_test_that_reads_the_real_machine_fails_loudly(fact, args, request) -> None:
    """The machine's own probes are refused unless the test is marked ``host('real')``; the described
    host answers instead."""
    with pytest.raises(RealHostRead, match=rf"read this machine's {fact}\(\).*host\('real'\)"):
        getattr(host_module._REAL, fact)(*args)
    getattr(host_module.current_host(), fact)(*args)  # the described host answers


@pytest.mark.host("h100", transformer_engine="2.7.0", packages=("deep_ep",))
def test_a_test_states_its_machine_with_the_host_mark() -> None:
    from megatron.bridge.training.config_stages.resolution.finalize import default_rule_context

    ctx = default_rule_context(8)
    assert ctx.device_capability == (9, 0) and ctx.device_name == "h100" and ctx.cuda_available
    assert str(ctx.te_version) == "2.7.0" and ctx.package("deep_ep")
    assert ctx.package("transformer_engine.pytorch.ep") is False  # every path's package is asked for


@pytest.mark.host("cpu")
def test_a_cpu_host_validates_for_an_unknown_gpu() -> None:
    from megatron.bridge.training.config_stages.resolution.finalize import default_rule_context

    ctx = default_rule_context(8)
    assert ctx.device_capability is None and not ctx.cuda_available and ctx.te_version is None


@pytest.mark.host("real")
def test_the_real_host_is_probed_only_for_a_test_about_the_machine() -> None:
    real = host_module.current_host()
    assert isinstance(real, host_module.RealHost)
    assert isinstance(real.gpu_count(), int) and real.memory_bytes() is None or real.memory_bytes() > 0


@pytest.mark.parametrize(
    "text, expected",
    [
        ("NVIDIA H100 80GB HBM3, 9.0\n", ((9, 0), "NVIDIA H100 80GB HBM3")),
        ("NVIDIA GB200, 10.0\nNVIDIA GB200, 10.0\n", ((10, 0), "NVIDIA GB200")),
        ("", (None, None)),
        ('Field "compute_cap" is not a valid field to query.', (None, None)),
    ],
)
def test_parse_nvidia_smi(text, expected) -> None:
    """The visible GPU is read without initialising CUDA (CUDA_DEVICE_MAX_CONNECTIONS comes later)."""
    assert host_module.parse_nvidia_smi(text) == expected
