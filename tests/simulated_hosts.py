"""The machines unit tests run on: each is described here, never read off the machine running them.

``tests/unit_tests/conftest.py`` makes one of these the host every test sees
(``megatron.bridge.utils.host.current_host``): the one a test names with ``@pytest.mark.host(NAME,
**facts)``, else the one ``$BRIDGE_TEST_HOST`` names, else ``cpu``. CI runs the configuration tests a
second time with ``BRIDGE_TEST_HOST=h100`` so that a test whose verdict depends on the host fails on a
CPU machine too, not only on a GPU one. ``@pytest.mark.host("real")`` is for the tests that are about
the machine's own probes.
"""

from __future__ import annotations

import dataclasses
import os

from megatron.bridge.utils.host import HostFacts

GIB = 2**30

SIMULATED_HOSTS: dict[str, HostFacts] = {
    "cpu": HostFacts(memory=24 * GIB),
    "h100": HostFacts(gpu_capability=(9, 0), gpu_name="NVIDIA H100 80GB HBM3", gpus=1, memory=128 * GIB),
    "h200": HostFacts(gpu_capability=(9, 0), gpu_name="NVIDIA H200", gpus=1, memory=128 * GIB),
}
"""``cpu``: a 2-core CI machine's kind (24 GiB, no GPU). ``h100``/``h200``: the GPU machines the GPU
lane runs on, with neither Transformer Engine nor DeepEP installed. Facts a test needs beyond these
(``transformer_engine="2.7.0"``, ``packages=("deep_ep",)``) are keywords of its ``host`` mark."""

REAL = "real"


class RealHostRead(AssertionError):
    """A unit test asked the machine it runs on for a fact its verdict would then depend on."""


ENVIRONMENT = "BRIDGE_TEST_HOST"


def default_host_name() -> str:
    """The host of tests that name none: ``$BRIDGE_TEST_HOST`` or ``cpu``."""
    name = os.environ.get(ENVIRONMENT, "cpu")
    if name not in SIMULATED_HOSTS:
        raise ValueError(f"{ENVIRONMENT}={name!r} is not one of {sorted(SIMULATED_HOSTS)}")
    return name


def simulated_host(name: str, **facts) -> HostFacts:
    """The host ``name`` with ``facts`` (fields of ``HostFacts``) changed."""
    return dataclasses.replace(SIMULATED_HOSTS[name], **facts)
