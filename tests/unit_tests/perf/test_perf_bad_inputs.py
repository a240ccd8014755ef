"""Bad input to ``run_script.py`` is refused before anything is launched: exit 2, and the message
names the field, the value, the rule and the fix. Each case is one a new user tried."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from checkpoint_stand_in import saved_checkpoint

from megatron.bridge.perf.harness.run import main

TINY_CPU = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-ep", "2", "--max_steps", "3"]


def _bad_yaml(tmp: Path) -> list[str]:
    path = tmp / "bad.yaml"
    path.write_text("model:\n  num_layers: 4\n bad: [1, 2\n")
    return ["--config_file", str(path)]


def _checkpoint(tmp: Path, layout: dict) -> Path:
    return saved_checkpoint(tmp / "ckpt", 3, layout)


def _other_layout(tmp: Path) -> list[str]:
    root = _checkpoint(tmp, dict(tp=1, pp=1, vpp=None, cp=1, ep=2, etp=1, dp=2))
    return ["-ep", "1", f"checkpoint.load={root}", f"checkpoint.save={root}"]


TINY_LAYOUT = dict(tp=1, pp=1, vpp=None, cp=1, ep=2, etp=1, dp=2)
"""The layout ``TINY_CPU`` trains with (what its checkpoints record)."""


def _resume_from(root: Path) -> list[str]:
    return [f"checkpoint.load={root}", f"checkpoint.save={root}"]


def _damaged_record(text: str):
    """A checkpoint of the tiny run whose ``parallel_layout.json`` holds ``text`` instead."""

    def build(tmp: Path) -> list[str]:
        root = _checkpoint(tmp, TINY_LAYOUT)
        (root / "iter_0000003" / "parallel_layout.json").write_text(text)
        return _resume_from(root)

    return build


def _long_tracker(tmp: Path) -> list[str]:
    root = _checkpoint(tmp, TINY_LAYOUT)
    (root / "latest_checkpointed_iteration.txt").write_text("9" * 5000)
    return _resume_from(root)


def _other_model(tmp: Path) -> list[str]:
    """A checkpoint with the tiny run's layout, written by a tiny model of four layers (two here)."""
    from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
    from megatron.bridge.training.config_stages.facts.checkpoint_dir import model_shape

    other = qwen3_moe_tiny_pretrain_config()
    other.model.num_layers = 4
    return _resume_from(_checkpoint(tmp, {**TINY_LAYOUT, "model": model_shape(other)}))


# case -> (extra argv built under tmp_path, rule id, texts the message must contain)
CASES = {
    "malformed yaml": (_bad_yaml, "yaml-syntax", ["config_file=", "line 3, column 2", "fix:"]),
    "deepep in cpu mode": (
        lambda tmp: ["--moe_flex_dispatcher_backend", "deepep"],
        "cpu-mode-no-flex-dispatcher",
        ["model.moe_token_dispatcher_type='flex'", "CUDA kernels", "--moe_flex_dispatcher_backend None"],
    ),
    "negative sequence length": (
        lambda tmp: ["model.seq_length=-1"],
        "range:model.seq_length",
        ["model.seq_length=-1", ">= 1"],
    ),
    "negative learning rate": (lambda tmp: ["optimizer.lr=-1"], "range:optimizer.lr", ["optimizer.lr=-1", ">= 0"]),
    "copy of an overlap switch set by override": (
        lambda tmp: ["model.overlap_moe_expert_parallel_comm=true"],
        "override-owned-field",
        [
            "model.overlap_moe_expert_parallel_comm=True",
            "comm_overlap.overlap_moe_expert_parallel_comm",
            "set comm_overlap.overlap_moe_expert_parallel_comm=true instead",
        ],
    ),
    "precision flag against the precision recipe": (
        lambda tmp: ["model.fp16=true"],
        "override-owned-field",
        ["model.fp16=True", "mixed_precision=null"],
    ),
    "ep overlap off by flag with delayed wgrad on": (
        lambda tmp: ["--moe_a2a_overlap", "false", "comm_overlap.delay_wgrad_compute=true"],
        "delay-wgrad-needs-ep-overlap",
        ["comm_overlap.delay_wgrad_compute=True", "--moe_a2a_overlap false sets only"],
    ),
    "resume with another layout": (
        _other_layout,
        "resume-same-parallel-layout",
        ["saved_layout=", "'ep': 2", "current_layout=", "'ep': 1"],
    ),
    "interleaved pipeline with too few micro-batches": (
        lambda tmp: ["-ep", "1", "-pp", "2", "-vp", "2", "-gb", "3", "model.num_layers=4"],
        "interleaved-pipeline-micro-batches",
        ["micro_batches_per_step=3", "multiple of the pipeline size"],
    ),
    "mtp layers": (lambda tmp: ["model.mtp_num_layers=1"], "mtp-not-built", ["model.mtp_num_layers=1"]),
    "transformer engine cuda graphs": (
        lambda tmp: ["--cuda_graph_impl", "transformer_engine"],
        "cuda-graph-impl-captured",
        ["model.cuda_graph_impl='transformer_engine'", "no effect", "full_iteration"],
    ),
    "local cuda graphs": (
        lambda tmp: ["--cuda_graph_impl", "local"],
        "cuda-graph-impl-captured",
        ["model.cuda_graph_impl='local'"],
    ),
    "whole-iteration graph in cpu mode": (
        lambda tmp: ["--cuda_graph_impl", "full_iteration"],
        "full-iteration-graph-needs-cuda",
        ["model.cuda_graph_impl='full_iteration'", "dist.device='cpu'", "model.cuda_graph_impl=none"],
    ),
    "checkpoint.load typo": (
        lambda tmp: [f"checkpoint.load={tmp / 'ckpt_typo'}"],
        "checkpoint-load-exists",
        ["ckpt_typo", "mkdir"],
    ),
    "triton cross-entropy in cpu mode": (
        lambda tmp: ["model.torch_native_cross_entropy_backend=triton"],
        "triton-cross-entropy-needs-cuda",
        ["model.torch_native_cross_entropy_backend='triton'", "dist.device='cpu'", "CUDA tensors only"],
    ),
    "compile switched off in cpu mode": (
        lambda tmp: ["model.torch_native_compile=false"],
        "torch-native-compile-off-needs-cuda",
        ["model.torch_native_compile=False", "no effect"],
    ),
    "grouped_mm in cpu mode": (
        lambda tmp: ["model.torch_native_grouped_gemm_backend=grouped_mm"],
        "grouped-mm-needs-hopper-bf16",
        ["model.torch_native_grouped_gemm_backend='grouped_mm'", "compute capability 9.0"],
    ),
    "tensor parallel size 0": (
        lambda tmp: ["model.tensor_model_parallel_size=0"],
        "range:model.tensor_model_parallel_size",
        ["model.tensor_model_parallel_size=0", ">= 1"],
    ),
    "context parallel size 0": (
        lambda tmp: ["model.context_parallel_size=0"],
        "range:model.context_parallel_size",
        ["model.context_parallel_size=0", ">= 1"],
    ),
    "expert parallel size 0": (
        lambda tmp: ["model.expert_model_parallel_size=0"],
        "range:model.expert_model_parallel_size",
        ["model.expert_model_parallel_size=0", ">= 1"],
    ),
    "layout record of 10**12 data-parallel ranks": (
        _damaged_record(json.dumps({**TINY_LAYOUT, "dp": 10**12})),
        "checkpoint-layout-record-valid",
        ["iter_0000003/parallel_layout.json", "1000000000000 ranks", "at most 131072"],
    ),
    "empty layout record": (
        _damaged_record("{}"),
        "checkpoint-layout-record-valid",
        ["parallel_layout.json", "'tp is missing'"],
    ),
    "layout record with a size that is text": (
        _damaged_record(json.dumps({**TINY_LAYOUT, "ep": "2"})),
        "checkpoint-layout-record-valid",
        ["ep='2' is not a positive integer"],
    ),
    "tracker of 5000 digits": (
        _long_tracker,
        "checkpoint-load-has-tracker",
        ["latest_checkpointed_iteration.txt holds more than 12 characters"],
    ),
    "checkpoint of another model shape": (
        _other_model,
        "resume-same-model-shape",
        ["saved_model={'num_layers': 4}", "current_model={'num_layers': 2}"],
    ),
    "a million experts in cpu mode": (
        lambda tmp: ["model.num_moe_experts=1000000"],
        "model-state-fits-host-memory",
        ["model.num_moe_experts=1000000", "estimate='at least", "GiB for the 2 rank(s) on this host", "limit='"],
    ),
    "fresh run saving over another run's checkpoints": (
        lambda tmp: [f"checkpoint.save={_checkpoint(tmp, {})}"],
        "checkpoint-save-not-another-runs",
        [
            "saved iteration(s) (iter_0000003)",
            "latest iteration 3",
            "checkpoint.load = checkpoint.save",
            "another (new or empty) checkpoint.save",
        ],
    ),
    "empty checkpoint.load (an unset variable)": (
        lambda tmp: ["checkpoint.load=", f"checkpoint.save={tmp / 'new'}"],
        "override-empty-value",
        ["checkpoint.load= gives no value", "checkpoint.load=null"],
    ),
    "checkpoint.load at one iteration": (
        lambda tmp: [f"checkpoint.load={_checkpoint(tmp, {}) / 'iter_0000003'}"],
        "checkpoint-load-is-iteration-dir",
        ["iter_0000003", "parent directory"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_refused_before_launch(case, tmp_path, no_launch):
    extra, rule, texts = CASES[case]
    out = io.StringIO()
    code = main([*TINY_CPU, "-l", str(tmp_path / "run"), *extra(tmp_path)], out=out)
    text = out.getvalue()
    assert code == 2, text
    assert f"[{rule}]" in text and "nothing was launched" in text
    for fragment in texts:
        assert fragment in text, (fragment, text)
    assert not (tmp_path / "run" / "config.yaml").exists()


@pytest.mark.host("h100", gpus=2, packages=())
def test_missing_deep_ep_on_a_gpu_host_is_refused_before_launch(tmp_path, no_launch):
    """A GPU machine without DeepEP: refused at validation, not by an ImportError in every rank."""
    out = io.StringIO()
    code = main(
        [
            "-mr",
            "qwen3_moe_tiny",
            "-g",
            "h100",
            "-ng",
            "2",
            "-ep",
            "2",
            "--moe_flex_dispatcher_backend",
            "deepep",
            "-l",
            str(tmp_path / "run"),
        ],
        out=out,
    )
    assert code == 2 and "[flex-needs-deep-ep]" in out.getvalue() and "deep_ep='not importable'" in out.getvalue()


@pytest.mark.host("h200")
def test_a_graph_of_ranks_sharing_a_gpu_over_gloo_is_refused_before_launch(tmp_path, no_launch):
    """``--procs_per_gpu 2`` makes the harness pick gloo; gloo's gradient reduction inside the captured
    step cannot be captured (it failed the first capture on an H200), so the graph is refused first."""
    out = io.StringIO()
    code = main(
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
            "--max_steps",
            "6",
            "--cuda_graph_impl",
            "full_iteration",
            "model.cuda_graph_warmup_steps=2",
            "model.torch_native_dispatcher=sorted",
            "model.torch_native_ep_transport=nvshmem",
            "-l",
            str(tmp_path / "run"),
        ],
        out=out,
    )
    text = out.getvalue()
    assert code == 2 and "[full-iteration-graph-needs-nccl]" in text, text
    assert "dist.distributed_backend='gloo', world_size=2" in text and "nothing was launched" in text


def test_empty_checkpoint_directory_starts_fresh_and_says_so(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    out = io.StringIO()
    code = main([*TINY_CPU, "--dryrun", f"checkpoint.load={ckpt}", f"checkpoint.save={ckpt}"], out=out)
    assert code == 0
    assert f"{ckpt} holds no checkpoint yet: starts from iteration 0 and saves there" in out.getvalue()


@pytest.mark.parametrize(
    "extra, decay, warmup, says",
    [
        ([], 20, 2, "learning-rate schedule scaled with it (lr_decay_iters 10 -> 20, lr_warmup_iters 1 -> 2)"),
        (["scheduler.lr_decay_iters=10"], 10, 2, "iterations 11-20 run at the minimum learning rate"),
    ],
    ids=["scaled", "kept-and-said"],
)
def test_max_steps_scales_the_schedule_or_says_what_it_does(tmp_path, extra, decay, warmup, says):
    from megatron.bridge.perf.harness.argument_parser import parse_args
    from megatron.bridge.perf.harness.config_builder import build_config

    argv = ["-mr", "qwen3_moe_tiny", "-g", "cpu", "-ng", "2", "-ep", "2", "--max_steps", "20", *extra]
    built = build_config(parse_args([*argv, "-l", str(tmp_path)]))
    assert (built.cfg.scheduler.lr_decay_iters, built.cfg.scheduler.lr_warmup_iters) == (decay, warmup)
    assert any(says in note for note in built.notes), built.notes
    out = io.StringIO()
    assert main([*argv, "--dryrun", "-l", str(tmp_path)], out=out) == 0 and says in out.getvalue()


def test_resuming_says_the_checkpoints_schedule_continues(tmp_path):
    """megatron-core's scheduler takes its lengths from the checkpoint: no scaling note, this one."""
    from megatron.bridge.perf.harness.config_builder import RESUMED_SCHEDULE_NOTE

    root = _checkpoint(tmp_path, dict(tp=1, pp=1, vpp=None, cp=1, ep=2, etp=1, dp=2))
    out = io.StringIO()
    code = main([*TINY_CPU[:-1], "20", "--dryrun", f"checkpoint.load={root}", f"checkpoint.save={root}"], out=out)
    assert code == 0 and RESUMED_SCHEDULE_NOTE in out.getvalue() and "scaled with it" not in out.getvalue()


# --------------------------------------------------------------------------------------------- sizes and counts
@pytest.mark.parametrize(
    "argv, rule, texts",
    [
        (
            ["-mr", "qwen3_moe_tiny", "-g", "h100", "-ng", "131072", "--procs_per_gpu", "2", "-ep", "2"],
            "world-size-bounded",
            ["262144 ranks", "at most 131072"],
        ),
        (
            ["-mr", "qwen3_moe_tiny", "-g", "h100", "-ng", "99999", "-ep", "2"],
            "layout-divides-gpu-count",
            ["GPU counts that fit: 2, 4, 6, 8, ..., 99998, 100000"],
        ),
    ],
    ids=["ranks beyond any job", "odd GPU count near 100000"],
)
def test_sizes_and_counts_are_refused_with_a_bounded_message(argv, rule, texts, tmp_path, no_launch):
    """Refused before launch with the rule and its numbers, in a message of a few lines (every fitting GPU
    count up to twice -ng was listed: 8.4 MB for -ng 999999), never an allocation failure in every rank."""
    out = io.StringIO()
    code = main([*argv, "--dryrun", "-l", str(tmp_path / "run")], out=out)
    text = out.getvalue()
    assert code == 2 and f"[{rule}]" in text and "nothing was launched" in text, text
    assert len(text) < 3000, len(text)
    for fragment in texts:
        assert fragment in text, (fragment, text)


@pytest.mark.parametrize("count", ["999999", "99999999"])
def test_an_absurd_gpu_count_is_a_usage_error_with_the_bound(count, capsys):
    """``-ng 99999999 -ep 2`` ran out of memory after 149 s listing the GPU counts that fit, ``-ng 999999``
    printed 8.4 MB; now the count is refused with the bound, before any config is built."""
    with pytest.raises(SystemExit) as exc:
        main([*TINY_CPU[:4], "-ng", count, "-ep", "2", "--dryrun"], out=io.StringIO())
    assert exc.value.code == 2
    assert f"-ng/--num_gpus: at most 131072 GPUs (more than any training job has: a typo?), got '{count}'" in (
        capsys.readouterr().err
    )


def test_a_million_experts_are_refused_on_h100_and_the_readme_layout_is_accepted(tmp_path, no_launch):
    """Refused with the estimate and the limit (it passed validation and failed allocating in every rank);
    the estimate is a lower bound, so the real recipe at its README layout is accepted."""
    out = io.StringIO()
    code = main(
        [
            "-mr",
            "qwen3_moe_tiny",
            "-g",
            "h100",
            "-ng",
            "2",
            "-ep",
            "2",
            "model.num_moe_experts=1000000",
            "--dryrun",
            "-l",
            str(tmp_path / "tiny"),
        ],
        out=out,
    )
    text = out.getvalue()
    assert code == 2 and "[model-state-fits-gpu-memory]" in text and "nothing was launched" in text, text
    assert "estimate='at least" in text and "GiB per rank" in text and "limit='94.0 GiB on one h100'" in text, text
    out = io.StringIO()
    code = main(["-mr", "qwen3_30b_a3b", "-g", "h100", "-ng", "16", "--dryrun", "-l", str(tmp_path / "30b")], out=out)
    assert code == 0 and "model-state-fits" not in out.getvalue(), out.getvalue()


@pytest.mark.parametrize("gpu, warned", [("h100", True), ("h200", False)])
def test_the_ep1_reference_at_48_layers_is_warned_of_before_launch_on_an_80_gb_h100(tmp_path, caplog, gpu, warned):
    """It ran out of an H100's memory mid-training (docs/benchmarks/ep_emulated_cluster.md); it is not
    refused (its lower bound fits a 94 GB H100 NVL), the dry run says it will likely not fit 80 GB."""
    out = io.StringIO()
    argv = ["-mr", "qwen3_30b_a3b", "-g", gpu, "-ng", "1", "-ep", "1", "model.num_moe_experts=8"]
    code = main([*argv, "train.global_batch_size=16", "--dryrun", "-l", str(tmp_path / gpu)], out=out)
    text = out.getvalue() + caplog.text  # warnings are logged (the console shows them before the report)
    assert code == 0, text
    assert ("[expected-peak-fits-smallest-gpu]" in text) is warned, text
    if warned:
        assert "expected peak='about 84.4 GiB'" in text and "80.0 GiB on the smallest h100" in text, text
