"""``--emulate`` through the harness: the layout is validated for its real GPU count, one process is
launched, the start-up says the world is emulated, and what it cannot play is refused before launch."""

from __future__ import annotations

import io

import pytest
from seed_command import README_COMMAND, for_gpu

from megatron.bridge.perf.harness.run import main

EMULATE = ["--emulate", "--network", "h100_ib400"]


def run(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(argv, out=out), out.getvalue()


def test_the_readme_command_emulated_is_validated_for_16_gpus_and_launches_one_process(tmp_path):
    code, out = run([*README_COMMAND, *EMULATE, "-l", str(tmp_path / "run"), "--dryrun"])
    assert code == 0, out
    assert "EMULATED world of 16 GPUs: one process on one GPU plays rank 0" in out
    assert "MODELED by network 'h100_ib400', not measured" in out
    launch = next(line for line in out.splitlines() if "loopback_torchrun" in line)
    assert "--nproc-per-node=1" in launch and "sbatch" not in out


@pytest.mark.parametrize(
    "extra, rule",
    [
        (["-pp", "2", "-ng", "32"], "emulation-no-pipeline-parallel"),
        (["--moe_flex_dispatcher_backend", "deepep"], "emulation-no-flex-dispatcher"),
        (["--emulate_rank", "16"], "emulation-rank-in-world"),
        (["emulation.network=h100_ib800"], "emulation-network-known"),
        (["--procs_per_gpu", "2"], "emulate-one-process"),
    ],
    ids=["pipeline", "deepep", "rank", "network", "procs-per-gpu"],
)
def test_what_an_emulated_world_cannot_play_is_refused_before_launch(extra, rule, tmp_path, no_launch):
    code, out = run([*README_COMMAND, *EMULATE, *extra, "-l", str(tmp_path / "run")])
    assert code == 2 and f"[{rule}]" in out and "nothing was launched" in out, out


def test_an_emulated_run_saves_no_checkpoint(tmp_path, no_launch):
    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    code, out = run(
        [*for_gpu("cpu"), *EMULATE, f"checkpoint.save={ckpt}", f"checkpoint.load={ckpt}", "-l", str(tmp_path / "run")]
    )
    assert code == 2 and "[emulation-no-checkpoints]" in out, out


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--network", "h100_ib400"], "--network"),
        (["--emulate_rank", "3"], "--emulate_rank"),
        (["--network", "free", "--emulate_rank", "1"], "--network, --emulate_rank"),
    ],
    ids=["network", "rank", "both"],
)
def test_an_emulation_flag_without_emulate_is_refused_naming_the_flag_and_the_fix(flags, named, capsys):
    """Without --emulate the run is a real one: a network model or a played rank would do nothing."""
    with pytest.raises(SystemExit) as exc:
        main([*README_COMMAND, *flags, "--dryrun"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"{named} without --emulate" in err and "add --emulate" in err, err
