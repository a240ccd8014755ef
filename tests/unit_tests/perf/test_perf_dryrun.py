"""``run_script.py`` end to end without launching: the README's command, exit codes, outputs."""

import io
import re
from pathlib import Path

import pytest

from megatron.bridge.perf.harness.argument_parser import parse_args
from megatron.bridge.perf.harness.config_builder import build_config, resolution_of, resolve
from megatron.bridge.perf.harness.run import main
from megatron.bridge.perf.harness.supervisor import JobOutcome


def run(argv):
    out = io.StringIO()
    code = main(argv, out=out)
    return code, out.getvalue()


@pytest.fixture(scope="module")
def readme_resolved(tmp_path_factory, readme_argv):
    built = build_config(parse_args([*readme_argv, "-l", str(tmp_path_factory.mktemp("spec"))]))
    return built, resolve(built)


def test_readme_command_resolves_as_documented(readme_resolved):
    built, r = readme_resolved
    assert r.model.overlap_moe_expert_parallel_comm is True  # CLI override beats --moe_a2a_overlap false
    assert r.comm_overlap.overlap_moe_expert_parallel_comm is True
    assert r.model.delay_wgrad_compute is False and r.ddp.delay_wgrad_compute is False
    assert r.model.moe_shared_expert_overlap is False
    assert r.model.moe_token_dispatcher_type == "alltoall" and r.model.moe_flex_dispatcher_backend is None
    assert r.model.expert_model_parallel_size == 16 and r.model.cuda_graph_impl == "none"
    assert r.train.train_iters == 8 and r.train.global_batch_size == 1024
    assert r.mixed_precision == "bf16_mixed" and r.tokenizer.tokenizer_type == "NullTokenizer"
    assert built.world_size == 16 and built.num_nodes == 2
    assert built.cfg.provenance["comm_overlap.overlap_moe_expert_parallel_comm"] == "cli"
    assert built.cfg.provenance["comm_overlap.delay_wgrad_compute"] == "cli"


def test_readme_command_dry_run_prints_everything(readme_command):
    code, out = run([*readme_command, "--dryrun"])
    assert code == 0, out
    log_dir = Path(readme_command[-1])
    assert not log_dir.exists(), "a dry run writes nothing"
    assert "== overlap report" in out and "dry run: nothing launched" in out
    assert "comm_overlap.overlap_moe_expert_parallel_comm" in out and "[cli]" in out
    assert "model.moe_token_dispatcher_type" in out and "'alltoall'  [flag]" in out
    assert "sbatch" in out and "megatron.bridge.training.entry --config-file" in out
    assert "16 GPUs on 2 node(s)" in out


def test_readme_command_with_ep1_exits_2_naming_the_field(readme_command):
    code, out = run([*readme_command, "--dryrun", "-ep", "1"])
    assert code == 2
    assert "expert_model_parallel_size" in out and "nothing was launched" in out


def test_moe_a2a_overlap_false_alone_turns_overlap_off(tmp_path, readme_argv):
    argv = [a for a in readme_argv if "=" not in a] + ["-l", str(tmp_path)]
    built = build_config(parse_args(argv))
    r = resolve(built)
    assert r.model.overlap_moe_expert_parallel_comm is False and r.model.delay_wgrad_compute is False
    code, out = run([*argv, "--dryrun"])
    assert code == 0 and "comm_overlap.overlap_moe_expert_parallel_comm" in out and "False  [flag]" in out


def test_all_violations_reported_at_once(readme_command):
    code, out = run([*readme_command, "--dryrun", "-ep", "1", "train.train_iters=0"])
    assert code == 2
    assert "expert_model_parallel_size" in out and "train.train_iters" in out


def test_save_config_filepath_round_trips(readme_command, tmp_path):
    from megatron.bridge.training.utils.omegaconf_utils import config_from_yaml

    path = tmp_path / "resolved.yaml"
    code, out = run([*readme_command, "--dryrun", "--save_config_filepath", str(path)])
    assert code == 0, out
    cfg = config_from_yaml(path)
    assert cfg.comm_overlap.overlap_moe_expert_parallel_comm is True
    assert cfg.train.train_iters == 8 and cfg.model.expert_model_parallel_size == 16
    assert cfg.provenance["comm_overlap.overlap_moe_expert_parallel_comm"] == "cli"


def test_multi_node_without_dryrun_writes_sbatch_script(readme_command):
    code, out = run(readme_command)
    assert code == 0, out
    log_dir = Path(readme_command[-1])
    script = log_dir / "launch.sbatch"
    assert script.is_file() and (log_dir / "config.yaml").is_file()
    assert f"sbatch {script}" in out
    assert "#SBATCH --nodes=2" in script.read_text()


@pytest.mark.host("cpu")
def test_gpu_run_on_machine_without_gpu_fails_fast(tmp_path):
    code, out = run(["-mr", "qwen3_moe_tiny", "-g", "h100", "-ng", "1", "-l", str(tmp_path / "r")])
    assert code == 3
    assert "0 visible GPU" in out and "--dryrun" in out and "-g cpu" in out


def test_bad_recipe_exit_2(tmp_path):
    code, out = run(["-m", "qwen", "-mr", "qwen9", "--dryrun"])
    assert code == 2 and "Available recipes" in out


def test_bad_override_exit_2(tmp_path):
    code, out = run(["-mr", "qwen3_moe_tiny", "-g", "cpu", "--dryrun", "model.num_layers=abc"])
    assert code == 2 and "model.num_layers" in out


@pytest.mark.parametrize(
    "given",
    ["comm_overlap.overlap_moe_expert_parallel_comm=false", "++comm_overlap.overlap_moe_expert_parallel_comm=false"],
)
def test_sweep_says_which_given_override_its_values_replace(tmp_path, given):
    code, out = run(
        [
            "-mr",
            "qwen3_moe_tiny",
            "-g",
            "cpu",
            "-ng",
            "2",
            "-ep",
            "2",
            "--dryrun",
            "-l",
            str(tmp_path / "s"),
            given,
            "--sweep",
            "comm_overlap.overlap_moe_expert_parallel_comm=false,true",
        ]
    )
    assert code == 0, out
    assert f"the swept values replace {given}" in out


def test_sweep_dry_run_describes_every_value(tmp_path):
    code, out = run(
        [
            "-mr",
            "qwen3_moe_tiny",
            "-g",
            "cpu",
            "-ng",
            "2",
            "-ep",
            "2",
            "--dryrun",
            "-l",
            str(tmp_path / "s"),
            "--sweep",
            "comm_overlap.overlap_moe_expert_parallel_comm=false,true",
        ]
    )
    assert code == 0, out
    assert "sweep comm_overlap.overlap_moe_expert_parallel_comm=false" in out
    assert "sweep comm_overlap.overlap_moe_expert_parallel_comm=true" in out
    assert "00_overlap_moe_expert_parallel_comm=false" in out and "01_overlap_moe_expert_parallel_comm=true" in out


def test_sweep_validates_every_value_before_launching(tmp_path):
    # EP overlap needs EP>1: the "true" job is invalid, so nothing runs at all
    code, out = run(
        [
            "-mr",
            "qwen3_moe_tiny",
            "-g",
            "cpu",
            "-ng",
            "1",
            "-l",
            str(tmp_path / "s"),
            "--sweep",
            "comm_overlap.overlap_moe_expert_parallel_comm=false,true",
        ]
    )
    assert code == 2 and "expert_model_parallel_size" in out
    assert not (tmp_path / "s").exists()


def test_sweep_keeps_environment_identical_across_values(tmp_path):
    code, out = run(
        [
            "-mr",
            "qwen3_moe_tiny",
            "-g",
            "h200",
            "-ng",
            "1",
            "--procs_per_gpu",
            "2",
            "-ep",
            "2",
            "--dryrun",
            "-l",
            str(tmp_path / "s"),
            "--sweep",
            "comm_overlap.overlap_moe_expert_parallel_comm=false,true",
        ]
    )
    assert code == 0, out
    launches = [line for line in out.splitlines() if "loopback_torchrun" in line]
    assert len(launches) == 2 and all("CUDA_DEVICE_MAX_CONNECTIONS=32" in line for line in launches)
    assert all("--nproc-per-node=2" in line for line in launches)
    assert "'gloo'  [computed]" in out


def _fake_run_plan(plan, stream=None, verbose=False):
    """Stand-in for the launcher: 'trains' by writing a summary.json whose speed depends on the job."""
    import json

    overlap = "overlap_moe_expert_parallel_comm=true" in str(plan.log_dir)
    step = 0.8 if overlap else 1.0
    times = [3.0, 2.0] + [step] * 6
    (plan.log_dir / "summary.json").write_text(
        json.dumps(
            {
                "step_times_s": times,
                "losses": [7.0 - 0.1 * i for i in range(8)],
                "world_size": plan.nprocs,
                "tokens_per_s": 1000.0,
                "tflops_per_gpu": 1.0,
                "peak_memory_gib": 0.5,
            }
        )
    )
    return JobOutcome(0)


def _on_a_gpu_machine(monkeypatch):
    """Sweeps on a GPU target (the machine check sees eight GPUs; the launch is faked)."""
    import megatron.bridge.perf.harness.execution as execution_module
    import megatron.bridge.perf.harness.job as job_module

    monkeypatch.setattr(execution_module, "run_plan", _fake_run_plan)
    monkeypatch.setattr(job_module, "gpus_visible", lambda: 8)


def test_sweep_runs_each_value_and_writes_outputs(tmp_path, monkeypatch):
    _on_a_gpu_machine(monkeypatch)
    root = tmp_path / "s"
    argv = [
        "-mr",
        "qwen3_moe_tiny",
        "-g",
        "h200",
        "-ng",
        "2",
        "-ep",
        "2",
        "--max_steps",
        "8",
        "-l",
        str(root),
        "comm_overlap.overlap_moe_expert_parallel_comm=false",
        "--sweep",
        "comm_overlap.overlap_moe_expert_parallel_comm=false,true",
    ]
    code, out = run(argv)
    assert code == 0, out
    assert "swept values replace comm_overlap.overlap_moe_expert_parallel_comm=false" in out
    assert out.count("Results") == 2
    md = (root / "sweep.md").read_text()
    assert "| `false` | 1.0000 | 1.0000 | 1.0000 | 1.000x |" in md
    assert "| `true` | 0.8000 | 0.8000 | 0.8000 | 1.250x |" in md
    assert "--sweep comm_overlap.overlap_moe_expert_parallel_comm=false,true" in md
    assert (root / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    from megatron.bridge.training.utils.omegaconf_utils import config_from_yaml

    on = config_from_yaml(root / "01_overlap_moe_expert_parallel_comm=true" / "config.yaml")
    assert on.comm_overlap.overlap_moe_expert_parallel_comm is True and on.train.train_iters == 8


def test_sweep_repeats_interleave_the_values_and_report_each_round(tmp_path, monkeypatch):
    _on_a_gpu_machine(monkeypatch)
    root = tmp_path / "s"
    argv = [
        "-mr",
        "qwen3_moe_tiny",
        "-g",
        "h200",
        "-ng",
        "2",
        "-ep",
        "2",
        "--max_steps",
        "8",
        "-l",
        str(root),
        "--sweep",
        "comm_overlap.overlap_moe_expert_parallel_comm=false,true",
        "--sweep_repeats",
        "2",
    ]
    code, out = run(argv)
    assert code == 0, out
    order = re.findall(r"^== running comm_overlap\.overlap_moe_expert_parallel_comm=(\w+) \(round", out, re.M)
    assert order == ["false", "true", "false", "true"]
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [
        "00_overlap_moe_expert_parallel_comm=false_r1",
        "00_overlap_moe_expert_parallel_comm=false_r2",
        "01_overlap_moe_expert_parallel_comm=true_r1",
        "01_overlap_moe_expert_parallel_comm=true_r2",
    ]
    md = (root / "sweep.md").read_text()
    assert "2 rounds run interleaved" in md
    assert "| `true` | 0.8000 | 0.8000 | 0.8000 | 1.250x | 0.8000 / 0.8000 | 0.0000 |" in md
    assert "--sweep_repeats 2" in md


def test_single_run_prints_results_table(tmp_path, monkeypatch):
    import megatron.bridge.perf.harness.execution as execution_module

    monkeypatch.setattr(execution_module, "run_plan", _fake_run_plan)
    code, out = run(["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-l", str(tmp_path / "r")])
    assert code == 0, out
    assert "iterations 3-8" in out and "1.0000 s" in out and str(tmp_path / "r" / "summary.json") in out


def test_failed_run_returns_its_exit_code(tmp_path, monkeypatch):
    import megatron.bridge.perf.harness.execution as execution_module

    monkeypatch.setattr(execution_module, "run_plan", lambda plan, stream=None, verbose=False: JobOutcome(5))
    code, out = run(["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "1", "-l", str(tmp_path / "r")])
    assert code == 5 and "Results" not in out


def test_dry_run_resolves_the_configuration_once(readme_command, resolution_counter, tmp_path):
    """The dry-run table, the overlap report, the saved YAML and the launch command all come from one
    resolution."""
    code, out = run([*readme_command, "--dryrun", "-v", "--save_config_filepath", str(tmp_path / "saved.yaml")])
    assert code == 0, out
    assert "== overlap report" in out and "effective overlap-related values" in out
    assert len(resolution_counter) == 1


def test_saved_config_and_launch_config_hold_the_effective_owners(readme_command, tmp_path):
    """What a user reads in the saved YAML is what the ranks load and what the run uses: the owners
    with their effective values, no copy; the ranks derive the copies from them."""
    import yaml

    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.training.config_stages.facts.ownership import OWNED_FIELDS, decided_copies
    from megatron.bridge.training.config_stages.schema.rule_base import read_field

    saved = tmp_path / "saved.yaml"
    code, out = run([*readme_command, "--save_config_filepath", str(saved)])  # multi-node: sbatch script
    assert code == 0, out
    launched = Path(readme_command[-1]) / "config.yaml"
    assert saved.read_text() == launched.read_text()
    data = yaml.safe_load(saved.read_text())
    resolution = resolution_of(build_config(parse_args(readme_command)))
    decided = decided_copies(resolution.effective)
    assert len(decided) > 10
    for owned in decided:
        section, _, name = owned.target.rpartition(".")
        assert name not in data[section], owned.target
    assert data["comm_overlap"]["overlap_moe_expert_parallel_comm"] is True
    assert data["comm_overlap"]["overlap_grad_reduce"] == resolution.values["overlap_grad_reduce"].value is True
    ranks_train = ConfigContainer.from_yaml(saved).validate(world_size=16)
    for owned in OWNED_FIELDS:
        if owned.owner.startswith("comm_overlap."):
            assert read_field(ranks_train, owned.target) == read_field(ranks_train, owned.owner), owned.target
    assert ranks_train.ddp.overlap_grad_reduce is True
    assert ranks_train.model.bf16 is True and ranks_train.optimizer.bf16 is True


def test_users_data_path_is_shown_before_launch(readme_command, tmp_path):
    prefix = tmp_path / "corpus_text_document"
    for suffix in (".bin", ".idx"):
        prefix.with_name(prefix.name + suffix).write_bytes(b"")
    code, out = run([*readme_command, "--dryrun", f"dataset.data_path={prefix}"])
    assert code == 0, out
    assert f"dataset.data_paths=['{prefix}'] (alias dataset.data_path)" in out


def test_missing_data_path_exits_2_naming_field_and_files(readme_command, tmp_path):
    missing = tmp_path / "nowhere" / "corpus_text_document"
    code, out = run([*readme_command, "--dryrun", f"dataset.data_path={missing}"])
    assert code == 2
    assert "dataset-files-exist" in out and f"{missing}.bin" in out and "nothing was launched" in out
