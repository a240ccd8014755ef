"""CPU smoke training of the tiny Qwen3-MoE recipe: EP=2 over two gloo processes, ~10 iterations.

One ``torch.distributed.run`` launch (see ``cpu_training_driver.py``) runs overlap off, overlap on
(megatron-core's combined-1F1B schedule), a run stopped by SIGTERM at iteration 5 and its resume,
a second resume of the finished run, and a run whose save dies before publishing plus its resume.
A second, single-process launch goes through the YAML entry point the launchers use.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("cpu_training_driver.py")

pytestmark = pytest.mark.functional


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_on_free_port) -> dict:
    out = tmp_path_factory.mktemp("cpu_training")

    def launch(port: int) -> dict:
        return dict(
            args=[
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                "2",
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(port),
                str(DRIVER),
                str(out),
            ]
        )

    proc = run_on_free_port(launch, capture_output=True, text=True, env=_env(), timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    data = json.loads((out / "results.json").read_text())
    data["out"] = str(out)
    data["stdout"] = proc.stdout
    return data


@pytest.mark.parametrize("schedule", ["off", "on"])
def test_loss_finite_and_decreasing(results: dict, schedule: str) -> None:
    losses = results[schedule]
    assert len(losses) == 10
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.3, losses


def test_overlap_schedule_matches_plain_schedule(results: dict) -> None:
    """The combined-1F1B schedule reorders work, not math: the same losses (CPU: bit-identical)."""
    for off, on in zip(results["off"], results["on"]):
        assert on == pytest.approx(off, abs=1e-6)


@pytest.mark.parametrize("moment", ["after_validate", "after_pretrain"])
def test_the_users_container_holds_owners_and_reads_effective_copies(results: dict, moment: str) -> None:
    """One storage per setting: the container a user validated and trained gains no attribute, a copy
    read on it (``ddp.overlap_grad_reduce``, ``model.delay_wgrad_compute``, ...) is its owner's
    effective value, and its saved YAML holds the owners only."""
    facts = results["one_storage"][moment]
    assert facts["container_extras"] == []
    assert facts["tree_extras"] == results["one_storage"]["tree_extras_before"]
    assert facts["copies_unlike_owners"] == []
    assert facts["copies_in_yaml"] == []


def test_validate_then_pretrain_resolves_the_container_once(results: dict) -> None:
    assert results["one_storage"]["resolutions"] == 1


def test_state_first_forward_step_trains(results: dict) -> None:
    """Megatron-Bridge's forward-step signature gets the run's state and trains as ours does."""
    assert results["state_first_step_iterations"] == [0, 1, 2]
    assert len(results["state_first_step"]) == 3
    assert results["state_first_step"][0] == pytest.approx(results["on"][0], abs=1e-6)


def test_gradient_accumulation_fusion_without_apex_trains_like_the_unfused_run(results: dict) -> None:
    """The same model and data with the weight gradients added into main_grad by this package's kernel
    (fp32 products) instead of DDP adding a bf16 gradient: the same training to rounding."""
    assert len(results["gaf"]) == 10 and all(math.isfinite(x) for x in results["gaf"])
    for off, fused in zip(results["off"], results["gaf"]):
        assert fused == pytest.approx(off, abs=2e-2)
    assert "gradient accumulation fusion: megatron-core's linear layers add into main_grad" in results["stdout"]
    summary = json.loads((Path(results["out"]) / "gaf" / "summary.json").read_text())
    assert summary["gradient_accumulation_fusion"]["enabled"] is True


def test_early_attention_release_reorders_the_ep_overlap_schedule_not_the_math(results: dict) -> None:
    """megatron-core's ``ep_overlap_early_attn_memory_release`` moves each layer's attention backward
    before the next micro-batch's MLP forward inside the EP-overlap schedule: the same losses (CPU:
    bit for bit), and the start-up report lists it as active."""
    assert results["early_attn_release"] == results["on"][:3]
    assert any("ep_early_attn_release" in line for line in results["stdout"].splitlines() if "active:" in line)


def test_a_resume_never_runs_code_planted_in_the_checkpoint(results: dict) -> None:
    """The per-rank RNG file is read with ``weights_only=True``: an object in its place is refused, its
    code never runs, and the message names the file."""
    assert results["planted_code_ran"] is False
    assert "rank_00000.pt" in results["planted_error"] and "could run code" in results["planted_error"]


def test_startup_log_says_what_runs(results: dict) -> None:
    out = results["stdout"]
    assert "CPU smoke mode: megatron-core CUDA calls mapped to CPU" in out
    assert "schedule: combined 1F1B (EP overlap)" in out
    assert "schedule: standard 1F1B" in out
    assert "CUDA graph: none (every kernel launched from Python)" in out
    assert "EP2" in out


def test_sigterm_on_a_save_interval_iteration_saves_it_once(results: dict) -> None:
    assert results["stopped_by_signal"] is True
    assert results["stopped_iteration"] == 5
    assert results["stopped"] == results["on"][:5]
    assert results["stopped_saves"] == [5]  # the interval save; the stop does not save 5 again
    assert (Path(results["out"]) / "ckpt" / "iter_0000005").is_dir()


def test_resume_reproduces_uninterrupted_run(results: dict) -> None:
    assert results["resumed_iteration"] == 10
    assert results["resumed"] == results["on"][5:]
    assert results["resumed_saves"] == [10]


def test_resuming_a_finished_run_saves_nothing(results: dict) -> None:
    assert results["finished_iteration"] == 10
    assert results["finished_saves"] == []


def test_save_that_dies_before_publishing_leaves_the_previous_checkpoint(results: dict) -> None:
    assert "simulated death while saving iteration 4" in results["interrupted_error"]
    assert results["interrupted_saves"] == [2, 4]
    # iteration 4 never became visible: only the staging directory and the tracker at 2
    left = results["interrupted_left"]  # the staging directory is named for the run that wrote it
    assert len(left) == 3 and left[0] == "iter_0000002" and left[2] == "latest_checkpointed_iteration.txt"
    assert left[1].startswith("iter_0000004.incomplete.")
    tracker = Path(results["out"]) / "ckpt_interrupted" / "latest_checkpointed_iteration.txt"
    assert tracker.read_text() == "4"  # written again by the resumed run below
    assert results["after_interrupted"] == results["on"][2:4]  # resumed bit-exactly from iteration 2
    assert results["after_interrupted_saves"] == [4]
    assert results["after_interrupted_left"] == ["iter_0000002", "iter_0000004", "latest_checkpointed_iteration.txt"]


def test_summary_json(results: dict) -> None:
    summary = json.loads((Path(results["out"]) / "on" / "summary.json").read_text())
    assert summary["losses"] == results["on"]
    assert summary["steady_state_window"] == [3, 10]  # automatic: 2 warm-up steps of 10 (max(2, 10 %))
    assert summary["steady_state_rule"].startswith("automatic: the first 2 of 10 steps")
    assert summary["world_size"] == 2
    assert summary["parallel_layout"]["ep"] == 2
    assert summary["steady_state_min_s"] <= summary["steady_state_mean_s"] <= summary["steady_state_max_s"]
    assert summary["tokens_per_s"] > 0 and summary["tflops_per_gpu"] > 0
    for key in ("overlap_report", "resolved_config", "peak_memory_gib", "step_times_s", "torch_native_kernels"):
        assert key in summary
    assert summary["cuda_graph"] == dict(
        impl="none",
        warmup_steps=None,
        captured_iteration=None,
        grad_nan_check_after_backward=False,
        capture_record_stream_reuse=None,
    )
    # megatron's own layers (layer_spec=local): no torch-native weight-gradient path to report.
    assert summary["expert_wgrad_accumulation"] is None and summary["dense_wgrad_accumulation"] is None
    config = yaml.safe_load(summary["resolved_config"])  # the effective config, not an error text
    assert config["model"]["expert_model_parallel_size"] == 2
    assert config["comm_overlap"]["overlap_moe_expert_parallel_comm"] is True


def test_entry_point_runs_a_resolved_yaml(tmp_path: Path, run_on_free_port) -> None:
    """What the launchers start: ``python -m megatron.bridge.training.entry --config-file X.yaml``."""
    sys.path.insert(0, str(REPO / "src"))
    from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config

    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.dist.device = "cpu"
    cfg.train.train_iters = 2
    cfg.logger.log_dir = str(tmp_path / "logs")
    cfg.to_yaml(tmp_path / "run.yaml")
    entry = [sys.executable, "-m", "megatron.bridge.training.entry", "--config-file", str(tmp_path / "run.yaml")]

    def launch(port: int) -> dict:  # the entry point reads the rendezvous from the environment
        return dict(args=entry, env=dict(_env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))

    proc = run_on_free_port(launch, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    summary = json.loads((tmp_path / "logs" / "summary.json").read_text())
    assert len(summary["losses"]) == 2
