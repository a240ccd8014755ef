"""Unit tests run on a described machine, not on the one that runs them.

Every test sees the host that ``tests/simulated_hosts.py`` describes (its ``host`` mark, else
``$BRIDGE_TEST_HOST``, else ``cpu``), so a configuration is validated and resolved the same way on a
laptop, a 2-core CI machine and a GPU node. Reading the real machine fails loudly
(:class:`RealHostRead`) unless the test is marked ``@pytest.mark.host("real")``: it is then about the
machine's own probes. ``simulate_host(**facts)`` changes the described machine inside a test.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import pytest
from simulated_hosts import REAL, RealHostRead, default_host_name, simulated_host

from megatron.bridge.utils import host as host_module
from megatron.bridge.utils.host import HostFacts


class _ForbiddenHost:
    """Stands in for this machine: every question is an error naming the fact and the way out."""

    def __init__(self, test: str):
        self.test = test

    def __getattr__(self, fact: str):
        def refuse(*args, **kwargs):
            raise RealHostRead(
                f"{self.test} read this machine's {fact}(): its verdict would depend on where it runs. "
                "Give it a described host (@pytest.mark.host('h100', transformer_engine='2.7.0'), or the "
                "simulate_host fixture), or mark it @pytest.mark.host('real') if it is about the machine's probes"
            )

        return refuse


def _described(request: pytest.FixtureRequest) -> tuple[str, dict]:
    marker = request.node.get_closest_marker("host")
    if marker is None:
        return default_host_name(), {}
    return (marker.args[0] if marker.args else default_host_name()), dict(marker.kwargs)


@pytest.fixture(autouse=True)
def described_host(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[HostFacts | None]:
    """The machine this test runs on, as described (``None`` for a test about the real machine)."""
    name, facts = _described(request)
    if name == REAL:
        yield None
        return
    monkeypatch.setattr(host_module, "_REAL", _ForbiddenHost(request.node.nodeid))
    with host_module.use_host(simulated_host(name, **facts)) as described:
        yield described


@pytest.fixture
def simulate_host(described_host) -> Callable[..., HostFacts]:
    """``simulate_host(packages=("deep_ep",))``: from here on the test runs on its described host with
    these facts changed; returns that host."""

    def change(**facts) -> HostFacts:
        current = host_module.current_host()
        assert isinstance(current, HostFacts), "simulate_host needs a described host, not host('real')"
        changed = dataclasses.replace(current, **facts)
        host_module._active = changed  # restored by described_host's use_host block
        return changed

    return change
