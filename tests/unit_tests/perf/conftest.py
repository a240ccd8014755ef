"""Shared pieces of the harness tests: the EP-overlap command of the README and the harness page, and
``no_launch`` (a test that must be answered before anything is launched)."""

import pytest

README_COMMAND = [
    "-m", "qwen", "-mr", "qwen3_30b_a3b", "--task", "pretrain", "-g", "h100", "-c", "bf16",
    "-ng", "16", "-gn", "8", "--max_steps", "8", "--cuda_graph_impl", "none",
    "--moe_flex_dispatcher_backend", "None", "--moe_a2a_overlap", "false",
    "--tokenizer_type", "NullTokenizer",
    "comm_overlap.overlap_moe_expert_parallel_comm=true",
    "comm_overlap.delay_wgrad_compute=false",
    "model.moe_shared_expert_overlap=false",
]


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
    import megatron.bridge.perf.run as run_module

    def refuse(*args, **kwargs):
        raise AssertionError("launched although the harness should have answered before launch")

    monkeypatch.setattr(run_module, "run_plan", refuse)
