"""What ``run_script.py`` says when it will not launch, through its real entry point
(``megatron.bridge.perf.harness.run.main``): short usage errors with the flag meant, recipe and layout
refusals with a suggestion and a rule id, a run that has nothing left to train, a dry run that
says what it does not write, a machine check before the launch is described, and a ``-h`` whose
defaults are shown once and true."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from checkpoint_stand_in import saved_checkpoint

from megatron.bridge.perf.harness.argument_parser import LOG_DIR_DEFAULT, SWEEP_DIR_DEFAULT
from megatron.bridge.perf.harness.run import main

TINY_CPU = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-ep", "2"]
LAYOUT = dict(tp=1, pp=1, vpp=None, cp=1, ep=2, etp=1, dp=2)
"""The parallel layout of ``TINY_CPU``, as a checkpoint records it."""


def run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(argv, out=out), out.getvalue()


# --------------------------------------------------------------------------------------------- usage errors
@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["-mr", "qwen3_moe_tiny", "--max-step", "10"],
            "unrecognized argument: --max-step (did you mean --max_steps?)",
        ),
        (["-mr", "qwen3_moe_tiny", "--max-steps=10"], "unrecognized argument: --max-steps (did you mean --max_steps?)"),
        (["-mr", "qwen3_moe_tiny", "--dry-run"], "unrecognized argument: --dry-run (did you mean --dryrun?)"),
        (["-mr", "qwen3_moe_tiny", "--num-gpus", "2"], "unrecognized argument: --num-gpus (did you mean --num_gpus?)"),
        (["-mr", "qwen3_moe_tiny", "-ng", "two"], "argument -ng/--num_gpus: expected a positive integer, got 'two'"),
        (["-g", "cpu"], "the following arguments are required: -mr/--model_recipe_name"),
        (
            ["-mr", "qwen3_moe_tiny", "--task", "sft"],
            "argument --task: no recipe is written for --task sft: the recipes are for --task pretrain "
            "(fine-tuning, Megatron-Bridge's sft and peft, is not offered)",
        ),
    ],
    ids=[
        "hyphen-and-missing-s",
        "with-equals",
        "dry-run",
        "hyphenated-long-flag",
        "bad-value",
        "missing-recipe",
        "fine-tuning-task",
    ],
)
def test_usage_error_is_short_and_names_the_flag_meant(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv, out=io.StringIO())
    err = capsys.readouterr().err
    assert exc.value.code == 2
    lines = err.splitlines()
    assert lines[0] == f"run_script.py: error: {message}", err
    assert len(lines) == 3 and lines[1].startswith("usage: run_script.py -mr RECIPE") and "-h" in lines[2], err


# --------------------------------------------------------------------------------------------- recipe, layout
@pytest.mark.parametrize(
    "argv, hint",
    [
        (["-mr", "qwen3_moe_tinny"], "did you mean -mr qwen3_moe_tiny?"),
        (["-mr", "qwen3_30b_a3"], "did you mean -mr qwen3_30b_a3b"),
        (["-m", "qwn", "-mr", "qwen3_moe_tiny"], "unknown model family 'qwn' (-m); did you mean -m qwen?"),
    ],
    ids=["recipe-typo", "recipe-cut-short", "family-typo"],
)
def test_unknown_recipe_suggests_the_name_meant_and_launches_nothing(argv, hint, no_launch):
    code, out = run([*argv, "-g", "cpu", "-ng", "2"])
    assert code == 2 and hint in out and out.rstrip().endswith("nothing was launched"), out


def test_layout_that_does_not_divide_the_gpu_count_names_its_rule(tmp_path, no_launch):
    code, out = run(["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "3", "-ep", "2", "-l", str(tmp_path / "run")])
    assert code == 2, out
    assert "[layout-divides-gpu-count]" in out and "given: -ng=3" in out and "-ep=2" in out
    assert "fix: GPU counts that fit: 2, 4, 6" in out and "nothing was launched" in out
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------------------------- nothing to train
def _finished_checkpoint(tmp_path: Path, iteration: int) -> Path:
    """A checkpoint directory whose latest saved iteration is ``iteration``."""
    return saved_checkpoint(tmp_path / "ckpt", iteration, LAYOUT)


@pytest.mark.parametrize("train_iters", [3, 2], ids=["at-the-last-iteration", "past-the-last-iteration"])
def test_rerunning_a_finished_run_is_answered_before_launch(tmp_path, no_launch, train_iters):
    root = _finished_checkpoint(tmp_path, 3)
    code, out = run(
        [
            *TINY_CPU,
            "--max_steps",
            str(train_iters),
            "-l",
            str(tmp_path / "run"),
            f"checkpoint.load={root}",
            f"checkpoint.save={root}",
        ]
    )
    assert code == 0, out
    assert f"nothing to train: {root} holds iteration 3 and train.train_iters={train_iters}" in out
    assert "raise --max_steps" in out and "nothing was launched" in out
    assert "== launch" not in out and "== starting" not in out
    assert not (tmp_path / "run").exists()


def test_dry_run_of_a_finished_run_says_nothing_would_train(tmp_path, no_launch):
    root = _finished_checkpoint(tmp_path, 3)
    code, out = run([*TINY_CPU, "--max_steps", "3", "--dryrun", f"checkpoint.load={root}"])
    assert code == 0 and "note: nothing to train" in out and "dry run: nothing launched" in out


@pytest.mark.parametrize(
    "values, code, said",
    [
        ("2,3", 0, "every sweep job has nothing to train"),
        ("3,5", 2, "[sweep-every-job-trains] 1 of 2 sweep jobs have nothing to train"),
    ],
    ids=["all-finished", "some-finished"],
)
def test_sweep_over_finished_runs_is_answered_before_launch(tmp_path, no_launch, values, code, said):
    root = _finished_checkpoint(tmp_path, 3)
    got, out = run(
        [*TINY_CPU, "-l", str(tmp_path / "sweep"), f"checkpoint.load={root}", "--sweep", f"train.train_iters={values}"]
    )
    assert got == code and said in out and "nothing was launched" in out, out
    assert "== launch" not in out and not (tmp_path / "sweep").exists()


# --------------------------------------------------------------------------------------------- dry run, machine
def test_dry_run_of_a_batch_job_says_the_script_is_not_written(readme_command, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    code, out = run([*readme_command, "--dryrun"])
    script = Path(readme_command[-1]) / "launch.sbatch"
    assert code == 0, out
    assert f"(dry run: {script} is not written; run without --dryrun to write it)" in out
    assert not script.exists()


@pytest.mark.host("cpu")
@pytest.mark.parametrize("sweep", [[], ["--sweep", "train.train_iters=2,3"]], ids=["single", "sweep"])
def test_gpu_launch_on_a_machine_without_gpus_is_refused_before_it_is_described(tmp_path, no_launch, sweep):
    code, out = run(["-mr", "qwen3_moe_tiny", "-g", "h100", "-ng", "1", "-l", str(tmp_path / "r"), *sweep])
    assert code == 3 and "0 visible GPU" in out and "nothing was launched" in out, out
    assert "== launch" not in out and "torch.distributed.run" not in out


# --------------------------------------------------------------------------------------------- -h
def _help(capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(["-h"], out=io.StringIO())
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_help_shows_each_default_once(capsys):
    text = _help(capsys)
    assert "(default: None)" not in text and "(default: False)" not in text
    blocks = re.split(r"\n(?=  -)", text.split("checkpoint and resume:")[0])
    twice = [block.split("\n")[0] for block in blocks if block.count("default") > 1]
    assert not twice, twice
    assert "(default: qwen)" in text and "(default: pretrain)" in text
    assert "(default: automatic, the steps after the first max(2, 10 %))" in " ".join(text.split())


def test_help_offers_only_the_tasks_a_recipe_is_written_for(capsys):
    """``--task`` lists what the recipes are written for (pretrain), not Megatron-Bridge's sft/peft,
    which have no recipe here."""
    task_line = next(line for line in _help(capsys).splitlines() if line.lstrip().startswith("--task"))
    assert "pretrain" in task_line and "sft" not in task_line and "peft" not in task_line, task_line


def _pattern(shown: str) -> str:
    """The help's directory pattern for ``-mr qwen3_moe_tiny --task pretrain`` as a regex."""
    regex = re.escape(shown)
    for placeholder, value in (
        (r"<\-mr>", "qwen3_moe_tiny"),
        (r"<\-\-task>", "pretrain"),
        (r"\[_<N>gpu\]", r"(_\d+gpu)?"),
        ("<YYYYmmdd_HHMMSS>", r"\d{8}_\d{6}"),
        ("<token>", "[0-9a-f]{6}"),
    ):
        regex = regex.replace(placeholder, value)
    return regex


@pytest.mark.parametrize(
    "shown, extra",
    [(LOG_DIR_DEFAULT, []), (SWEEP_DIR_DEFAULT, ["--sweep", "train.train_iters=2,3"])],
    ids=["run", "sweep"],
)
def test_help_names_the_run_directory_a_run_without_l_gets(shown, extra, capsys, tmp_path, monkeypatch):
    assert shown in _help(capsys).replace("\n", " ").replace("  ", "")
    monkeypatch.chdir(tmp_path)
    code, out = run([*TINY_CPU, "--dryrun", *extra])
    assert code == 0, out
    assert re.search(re.escape(str(tmp_path.resolve())) + "/" + _pattern(shown) + "/", out), (shown, out)
