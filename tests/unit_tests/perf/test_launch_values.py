"""Values a user passes that end up in the written batch script: refused before anything is written
when they could change what the script runs, quoted where they are written."""

from __future__ import annotations

import io
import subprocess

import pytest

from megatron.bridge.perf.harness.run import main

SBATCH_RUN = ["-mr", "qwen3_30b_a3b", "-g", "h100", "-ng", "16", "-gn", "8", "--max_steps", "4"]


def harness(argv: list[str], monkeypatch) -> tuple[int, str]:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    out = io.StringIO()
    return main(argv, out=out), out.getvalue()


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--account", "acct\ntouch pwned"),
        ("--partition", "batch\nrm -rf ~"),
        ("--time", "01:00:00\ntouch pwned"),
        ("--time", "1 hour"),
        ("--account", "a;b"),
    ],
)
def test_a_value_that_would_change_the_script_is_refused_before_anything_is_written(tmp_path, monkeypatch, flag, value):
    code, out = harness([*SBATCH_RUN, "-l", str(tmp_path / "run"), flag, value], monkeypatch)
    assert code == 2 and "nothing was launched" in out
    assert f"{flag} {value!r}" in out and "fix:" in out
    assert not (tmp_path / "run" / "launch.sbatch").exists()


def test_every_bad_value_is_listed_at_once(tmp_path, monkeypatch):
    code, out = harness(
        [*SBATCH_RUN, "-l", str(tmp_path / "run"), "--account", "a\nb", "--partition", "p q", "--time", "x"],
        monkeypatch,
    )
    assert code == 2 and all(flag in out for flag in ("--account", "--partition", "--time"))


@pytest.mark.parametrize("name", ["with space", "percent%x", 'quote"x'])
def test_a_run_directory_sbatch_would_misread(tmp_path, monkeypatch, name):
    code, out = harness([*SBATCH_RUN, "-l", str(tmp_path / name)], monkeypatch)
    if name == "with space":  # quoted in the script: accepted, and the script parses
        assert code == 0, out
        script = (tmp_path / name / "launch.sbatch").read_text()
        assert f'#SBATCH --output="{tmp_path / name}/slurm-%j.out"' in script
        assert subprocess.run(["bash", "-n", str(tmp_path / name / "launch.sbatch")]).returncode == 0
    else:
        assert code == 2 and "-l/logger.log_dir" in out and "nothing was launched" in out


def test_valid_values_give_a_script_whose_sbatch_lines_all_come_before_any_command(tmp_path, monkeypatch):
    code, out = harness(
        [
            *SBATCH_RUN,
            "-l",
            str(tmp_path / "run"),
            "--account",
            "proj_1",
            "--partition",
            "batch,debug",
            "--time",
            "1-02:00:00",
        ],
        monkeypatch,
    )
    assert code == 0, out
    lines = (tmp_path / "run" / "launch.sbatch").read_text().splitlines()
    first_command = next(i for i, line in enumerate(lines[1:], 1) if line and not line.startswith("#"))
    directives = [line for line in lines[:first_command] if line.startswith("#SBATCH")]
    assert {
        "#SBATCH --account=proj_1",
        "#SBATCH --partition=batch,debug",
        "#SBATCH --time=1-02:00:00",
        "#SBATCH --signal=B:TERM@120",
    } <= set(directives)


def test_a_run_directory_that_is_a_file_is_refused(tmp_path, monkeypatch):
    target = tmp_path / "taken"
    target.write_text("x")
    code, out = harness(["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-ep", "2", "-l", str(target)], monkeypatch)
    assert code == 2 and "is a file, not a directory" in out and "Traceback" not in out
