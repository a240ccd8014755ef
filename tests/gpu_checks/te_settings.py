"""GPU check: each Transformer Engine setting of the harness either trains or is refused before launch.

One GPU with Transformer Engine: ``python tests/gpu_checks/te_settings.py --out DIR``. Each case is the
harness's own build of ``run_script.py`` flags and dotted overrides (its validation, its YAML): a case
the rules refuse is recorded with the rule ids; an accepted case trains a few steps through
``pretrain()`` in this process (one start-up for all cases), except the ``validate``-only ones (EP=2
needs two GPUs). Writes ``DIR/te_settings.json`` and prints one ``REPORT`` line; a setting that
crashed after launch shows as ``failed`` with its error, and then needs a rule.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

BASE = [
    "-m",
    "qwen",
    "-mr",
    "qwen3_30b_a3b",
    "--task",
    "pretrain",
    "-g",
    "h200",
    "-c",
    "bf16",
    "-ng",
    "1",
    "-ep",
    "1",
    "-mb",
    "1",
    "-gb",
    "2",
    "-sl",
    "2048",
    "--max_steps",
    "3",
    "--cuda_graph_impl",
    "none",
    "--moe_flex_dispatcher_backend",
    "None",
    "--tokenizer_type",
    "NullTokenizer",
    "model.num_layers=2",
    "model.num_moe_experts=8",
    "model.moe_router_topk=8",
    "scheduler.lr_warmup_iters=1",
    "logger.steady_state_window=[2,3]",
]
TE = ["model.layer_spec=transformer_engine"]
FUSIONS = [
    "model.moe_permute_fusion=true",
    "model.apply_rope_fusion=true",
    "model.bias_activation_fusion=true",
    "model.moe_router_fusion=true",
    "model.cross_entropy_fusion_impl=te",
]
EP2_OVERLAP = ["-ng", "2", "-ep", "2", "-gb", "4", "--moe_a2a_overlap", "true"]

# name -> (arguments after BASE, what to do: "train" or "validate")
CASES: dict[str, tuple[list[str], str]] = {
    "auto_with_te": ([], "train"),
    "te_recipe": (TE, "train"),
    "moe_permute_fusion": (TE + FUSIONS[:1], "train"),
    "apply_rope_fusion": (TE + FUSIONS[1:2], "train"),
    "bias_activation_fusion": (TE + FUSIONS[2:3], "train"),
    "moe_router_fusion": (TE + FUSIONS[3:4], "train"),
    "cross_entropy_te": (TE + FUSIONS[4:5], "train"),
    "masked_softmax_bias_dropout_persist_ln": (
        TE + ["model.masked_softmax_fusion=true", "model.bias_dropout_fusion=true", "model.persist_layer_norm=true"],
        "train",
    ),
    "gradient_accumulation_fusion": (TE + ["model.gradient_accumulation_fusion=true"], "train"),
    "all_fusions_and_gaf": (TE + FUSIONS + ["model.gradient_accumulation_fusion=true"], "train"),
    "te_sequential_experts": (TE + ["model.moe_grouped_gemm=false"], "train"),
    "te_rng_tracker": (TE + ["rng.te_rng_tracker=true"], "train"),
    "fp8_current_scaling": (["-c", "fp8_cs"], "train"),
    "fp8_delayed_scaling": (["-c", "fp8_ds"], "train"),
    "mxfp8_on_hopper": (["-c", "fp8_mx"], "train"),
    "torch_native_gaf": (["model.layer_spec=torch_native", "model.gradient_accumulation_fusion=true"], "train"),
    "te_graph_attn": (TE + ["--cuda_graph_impl", "transformer_engine", "model.cuda_graph_modules=[attn]"], "train"),
    "te_graph_moe_router_preprocess": (
        TE + ["--cuda_graph_impl", "transformer_engine", "model.cuda_graph_modules=[moe_router,moe_preprocess]"],
        "train",
    ),
    "ep2_overlap_delay_wgrad": (TE + EP2_OVERLAP + ["comm_overlap.delay_wgrad_compute=true"], "validate"),
    "ep2_overlap_delay_wgrad_gaf": (
        TE + EP2_OVERLAP + ["comm_overlap.delay_wgrad_compute=true", "model.gradient_accumulation_fusion=true"],
        "validate",
    ),
    "ep2_overlap_delay_wgrad_graph_attn": (
        TE
        + EP2_OVERLAP
        + [
            "comm_overlap.delay_wgrad_compute=true",
            "model.gradient_accumulation_fusion=true",
            "--cuda_graph_impl",
            "transformer_engine",
            "model.cuda_graph_modules=[attn]",
        ],
        "validate",
    ),
}


def build(name: str, argv: list[str], out: Path):
    """The harness's job for one case, or the typed error that refused it."""
    from megatron.bridge.perf.harness.argument_parser import parse_args
    from megatron.bridge.perf.harness.config_builder import build_config
    from megatron.bridge.perf.harness.execution import prepare
    from megatron.bridge.perf.harness.job import make_job

    args = parse_args([*BASE, *argv, "-l", str(out / name)])
    job = make_job(build_config(args), args)
    prepare(job)
    return job


def train(job) -> dict:
    """A few steps through ``pretrain()`` from the YAML the harness wrote (what a rank loads)."""
    from megatron.bridge.training.config import ConfigContainer
    from megatron.bridge.training.pretrain import pretrain

    cfg = ConfigContainer.from_yaml(job.built.log_dir / "config.yaml")
    result = pretrain(cfg)
    summary = json.loads(Path(result.summary_path).read_text())
    return dict(
        outcome="trained" if all(math.isfinite(x) for x in result.losses) else "failed",
        losses=result.losses,
        layer_spec=summary["layer_spec"],
        layer_spec_reason=summary["layer_spec_reason"],
        gradient_accumulation_fusion=summary["gradient_accumulation_fusion"]["description"],
        step_s=summary.get("steady_state_mean_s"),
    )


def run_case(name: str, argv: list[str], action: str, out: Path) -> dict:
    from megatron.bridge.training.errors import ConfigError

    try:
        job = build(name, argv, out)
    except ConfigError as exc:
        rules = [v.rule for v in getattr(exc, "violations", [])]
        return dict(outcome="refused", rules=rules, error=str(exc)[:1500])
    if action == "validate":
        return dict(outcome="valid", layer_spec=job.resolution.layer_spec.name, report=job.brief_report)
    try:
        return train(job)
    except Exception as exc:  # the point of the check: what crashes after launch
        return dict(
            outcome="failed", error=f"{type(exc).__name__}: {exc}"[:1500], traceback=traceback.format_exc()[-3000:]
        )


def mxfp8_support() -> str | None:
    """Transformer Engine's own answer to whether this GPU runs MXFP8."""
    try:
        import transformer_engine.pytorch as te

        check = getattr(te, "is_mxfp8_available", None)
        if check is not None:
            return repr(check(return_reason=True))
        from transformer_engine.pytorch.fp8 import check_mxfp8_support

        return repr(check_mxfp8_support())
    except Exception as exc:
        return f"not asked: {type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", nargs="*", help="run these cases only")
    args = p.parse_args(argv)
    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=os.environ.get("MASTER_PORT", "29511"),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    for name, (case_argv, action) in CASES.items():
        if args.only and name not in args.only:
            continue
        results[name] = dict(argv=case_argv, action=action, **run_case(name, case_argv, action, args.out))
        print(
            f"== {name}: {results[name]['outcome']} {results[name].get('rules') or ''} "
            f"{results[name].get('error', '')[:300]}",
            flush=True,
        )
        (args.out / "te_settings.json").write_text(json.dumps(dict(cases=results), indent=2))
    import torch

    from megatron.bridge.utils.import_utils import describe_transformer_engine

    report = dict(
        transformer_engine=describe_transformer_engine(),
        torch=torch.__version__,
        gpu=torch.cuda.get_device_name(0),
        mxfp8_support=mxfp8_support(),
        cases=results,
    )
    (args.out / "te_settings.json").write_text(json.dumps(report, indent=2))
    print("REPORT " + json.dumps({k: v["outcome"] for k, v in results.items()}), flush=True)
    return 0 if all(r["outcome"] != "failed" for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
