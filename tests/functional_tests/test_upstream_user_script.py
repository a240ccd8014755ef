"""A Megatron-Bridge user's own pretraining script, run as they run it: ``torch.distributed.run`` on CPU.

One single-process launch of ``upstream_user_script.py`` (the tiny recipe, a few iterations) checks
Megatron-Bridge's call ``pretrain(config=cfg, forward_step_func=forward_step)``, a recipe called with
Megatron-Bridge's keyword arguments, the model's vocabulary taken from the NullTokenizer, the refusal
of ``callbacks`` and the resume that ``dir=``/``name=`` give.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("upstream_user_script.py")

pytestmark = pytest.mark.functional


@pytest.fixture(scope="module")
def results(tmp_path_factory, run_on_free_port) -> dict:
    out = tmp_path_factory.mktemp("upstream_user_script")
    path = os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)

    def launch(port: int) -> dict:
        return dict(
            args=[
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                "1",
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(port),
                str(SCRIPT),
                str(out),
            ]
        )

    proc = run_on_free_port(launch, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    data = json.loads((out / "results.json").read_text())
    data["out"] = str(out)
    return data


def test_callbacks_are_refused_by_name_before_any_process_group(results: dict) -> None:
    assert results["callbacks_rules"] == ["pretrain-callbacks-not-supported"]
    assert results["callbacks_error_is_type_error"] is True
    assert "callbacks=" in results["callbacks_error"] and "fix:" in results["callbacks_error"]
    assert results["process_group_after_refusal"] is False


def test_upstream_call_trains_with_the_users_forward_step(results: dict) -> None:
    assert results["first_load"] is None  # a fresh run directory: nothing to resume
    assert results["first_iteration"] == 3
    assert results["first_seen_iterations"] == [0, 1, 2]
    assert len(results["first_losses"]) == 3 and all(math.isfinite(x) for x in results["first_losses"])
    # the vocabulary came from the NullTokenizer: the loss starts near ln(1024) (a uniform guess)
    assert abs(results["first_losses"][0] - math.log(1024)) < 1.0
    assert results["user_vocab_size"] is None  # the user's field stays as written


def test_dir_and_name_resume_from_the_run_directory(results: dict) -> None:
    checkpoints = Path(results["out"]) / "run" / "checkpoints"
    assert results["second_load"] == str(checkpoints)
    assert (checkpoints / "iter_0000003").is_dir() and (checkpoints / "iter_0000005").is_dir()
    assert results["second_iteration"] == 5
    assert results["second_seen_iterations"] == [3, 4]
    assert len(results["second_losses"]) == 2
    assert results["summary_path"] == str(Path(results["out"]) / "run" / "summary.json")
