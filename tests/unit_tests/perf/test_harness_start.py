"""The harness answers what needs no config (``-h``, a mistyped flag, an unknown recipe or family, a
malformed ``--sweep``, a misspelt dotted override in any of Hydra's forms) without importing torch or
megatron-core, which take seconds: the script runs as a user runs it, in a child process that reports
which modules were loaded when it answered. How long the answers and a dry run take is measured by
``scripts/performance/harness_start_times.py``, not asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from megatron.bridge.perf.harness import recipe_lookup

ROOT = Path(__file__).resolve().parents[3]
RUN_SCRIPT = ROOT / "scripts" / "performance" / "run_script.py"
CHILD = Path(__file__).with_name("children") / "harness_imports.py"

ANSWERED_WITHOUT_A_CONFIG = {
    "help": (["--help"], 0, "--max_steps"),
    "unknown-flag": (["-mr", "qwen3_moe_tiny", "--max-step", "10"], 2, "did you mean --max_steps"),
    "unknown-recipe": (["-mr", "qwen3_moe_tinny", "-g", "cpu"], 2, "did you mean -mr qwen3_moe_tiny?"),
    "unknown-task": (["-mr", "qwen3_moe_tiny", "--task", "sft"], 2, "no recipe is written for --task sft"),
    "unknown-family": (["-m", "qwn", "-mr", "qwen3_moe_tiny"], 2, "did you mean -m qwen?"),
    "bad-sweep": (["-mr", "qwen3_moe_tiny", "--sweep", "model.num_layers=2"], 2, "at least two distinct values"),
    "misspelt-override": (
        ["-mr", "qwen3_moe_tiny", "-g", "cpu", "train.trian_iters=3"],
        2,
        "[override-unknown-key] 'train.trian_iters' is not a field of TrainingConfig\n"
        "    given: train.trian_iters=3\n    fix: did you mean train.train_iters",
    ),
    "misspelt-hydra-forms": (
        ["-mr", "qwen3_moe_tiny", "++modle.num_layers=2", "~train.trian_iters"],
        2,
        "'modle' is not a field of ConfigContainer",
    ),
    "misspelt-model-field": (["-mr", "qwen3_moe_tiny", "model.num_layerz=2"], 2, "did you mean model.num_layers"),
    "misspelt-swept-key": (
        ["-mr", "qwen3_moe_tiny", "--sweep", "comm_overlap.overlap_moe_expert_parallel_com=0,1"],
        2,
        "did you mean comm_overlap.overlap_moe_expert_parallel_comm",
    ),
}
"""case -> (arguments, exit code, text of the answer)."""


def _run_harness(arguments: list[str]) -> dict:
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(RUN_SCRIPT), *arguments], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", sorted(ANSWERED_WITHOUT_A_CONFIG))
def test_answers_that_need_no_config_import_neither_torch_nor_megatron_core(case):
    arguments, code, text = ANSWERED_WITHOUT_A_CONFIG[case]
    answer = _run_harness(arguments)
    assert answer["exit"] == code and text in answer["printed"], answer
    assert "Traceback" not in answer["printed"], answer["printed"]
    assert not answer["torch"] and not answer["megatron.core"], (case, answer)


@pytest.mark.parametrize("family", recipe_lookup.available_families())
def test_the_recipe_names_read_from_source_are_the_families_recipes(family):
    """The lookup refuses a name from the family's source without importing it, so the source must
    name exactly the recipes the imported family has."""
    import importlib

    module = importlib.import_module(f"megatron.bridge.recipes.{family}")
    assert recipe_lookup.declared_recipe_names(family) == set(recipe_lookup.recipe_functions(module))
