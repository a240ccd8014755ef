"""Shared pieces of the harness tests: the EP-overlap command of the README and the harness page, and
``no_launch`` (a test that must be answered before anything is launched)."""

import pytest
from seed_command import README_COMMAND

# The harness imports megatron-core only when it builds a config. The tests import it here, while they
# are collected, where the package's quiet filters apply (megatron.bridge.utils.quiet), so that its
# import-time warnings stay out of the test report (inside a test pytest resets the filters).
import megatron.bridge.training.config  # noqa: E402,F401


@pytest.fixture(scope="session")
def readme_argv():
    """The command exactly as the README writes it."""
    return list(README_COMMAND)


@pytest.fixture
def readme_command(tmp_path):
    """The README's command with the log directory pointed at a temporary folder."""
    return [*README_COMMAND, "-l", str(tmp_path / "run")]


@pytest.fixture
def no_launch(monkeypatch):
    """Any launch attempt fails the test: refusals and answers given before launch come first."""
    import megatron.bridge.perf.harness.execution as execution_module

    def refuse(*args, **kwargs):
        raise AssertionError("launched although the harness should have answered before launch")

    monkeypatch.setattr(execution_module, "run_plan", refuse)
