"""Child program: where a dispatch path added as one module and one registry line shows up.

Run on a copy of the source tree into which ``test_extending_guide.py`` wrote the toy paths of
``toy_dispatch_paths/`` (``toy``: torch-native; ``toyep``: a flex backend) and their registry lines. It
asks the product's real entry points (the model fields' types, the dotted-override check, the harness's
flags and dry run, ``cfg.validate()``, the docs generators, the rule context's probes, the start-up
text, the torch-native MoE layer, the emulation benchmark) and prints ``REPORT {json}``. The machine is
described (a CPU host without the toy package), never read.

Usage: ``toy_dispatch_report.py LOG_DIR``.
"""

import io
import itertools
import json
import sys
import typing
from pathlib import Path

from megatron.bridge.utils.host import HostFacts, use_host

LOG_DIR = Path(sys.argv[1])
_RUNS = itertools.count()


def harness(*argv: str) -> dict:
    """``run_script.py ARGV --dryrun``: its exit code and output."""
    from megatron.bridge.perf.harness.run import main

    out = io.StringIO()
    code = main(["-mr", "qwen3_moe_tiny", *argv, "--dryrun", "-l", str(LOG_DIR / f"run{next(_RUNS)}")], out=out)
    return {"code": code, "out": out.getvalue()}


def field_choices() -> dict:
    from megatron.bridge.models import gpt_provider
    from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
    from megatron.bridge.training.utils.omegaconf_utils import apply_overrides

    overrides = ["model.torch_native_dispatcher=toy", "model.moe_flex_dispatcher_backend=toyep"]
    cfg = apply_overrides(qwen3_moe_tiny_pretrain_config(), overrides)
    return {
        "torch_native": list(typing.get_args(gpt_provider.TorchNativeDispatcher)),
        "flex": list(typing.get_args(gpt_provider.FlexBackend)),
        "overridden": [cfg.model.torch_native_dispatcher, cfg.model.moe_flex_dispatcher_backend],
    }


def harness_choices() -> dict:
    from megatron.bridge.perf.harness.argument_parser import build_parser, parse_args

    args = parse_args(["-mr", "qwen3_moe_tiny", "--moe_flex_dispatcher_backend", "toyep"])
    return {"taken": args.moe_flex_dispatcher_backend, "help": build_parser().format_help()}


def docs() -> dict:
    from megatron.bridge.training.config_stages.resolution.overlap_docs import render_docs
    from megatron.bridge.training.config_stages.rules.flex_rules import render_support_table

    return {"support_table_header": render_support_table().splitlines()[0], "overlap_page": render_docs()}


def start_up_text() -> dict:
    from megatron.bridge.models.dispatch.path_registry import describe_dispatcher
    from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config

    model = qwen3_moe_tiny_pretrain_config().model
    model.moe_token_dispatcher_type, model.moe_flex_dispatcher_backend = "flex", "toyep"
    return {"flex": describe_dispatcher(model)}


def built_layer() -> dict:
    """A torch-native MoE layer of one rank, built as a model builds it, asking for the toy path."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron.bridge.models.torch_native import get_torch_native_decoder_block_spec
    from megatron.bridge.models.torch_native.moe_layer import dispatch_choices

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    ps.initialize_model_parallel(1, 1, expert_model_parallel_size=1)
    tensor_parallel.model_parallel_cuda_manual_seed(1234, inference_rng_tracker=True, force_reset_rng=True)
    MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = object()  # megatron's dispatcher asks CUDA for a stream
    config = TransformerConfig(
        num_layers=1,
        hidden_size=32,
        num_attention_heads=4,
        ffn_hidden_size=64,
        moe_ffn_hidden_size=24,
        num_moe_experts=4,
        moe_router_topk=2,
        moe_token_dispatcher_type="alltoall",
        add_bias_linear=False,
        use_cpu_initialization=True,
        gradient_accumulation_fusion=False,
        params_dtype=torch.float32,
        activation_func=F.silu,
        gated_linear_unit=True,
        bias_activation_fusion=False,
    )
    config.torch_native_dispatcher = "toy"
    layer = get_torch_native_decoder_block_spec(config).layer_specs[0].submodules.mlp(config=config)
    choices = dispatch_choices([layer])
    return {"dispatcher": type(layer.token_dispatcher).__name__, "choices": [c.describe() for c in choices]}


def main() -> None:
    from megatron.bridge.perf.benchmarks.emulation_benchmark import DISPATCHERS
    from megatron.bridge.training.config_stages.resolution.finalize import default_rule_context

    toyep = ("-ng", "2", "-ep", "2", "--moe_flex_dispatcher_backend", "toyep")
    with use_host(HostFacts(memory=24 * 2**30)):
        report = {
            "fields": field_choices(),
            "harness": harness_choices(),
            "flex_on_blackwell": harness("-g", "b200", *toyep),
            "flex_on_hopper": harness("-g", "h100", *toyep),
            "flex_rule": harness("-g", "b200", *toyep, "model.num_moe_experts=3"),
            "toy_rule": harness("-g", "cpu", "-ng", "2", "-ep", "2", "model.torch_native_dispatcher=toy"),
            "docs": docs(),
            "probed": dict(default_rule_context().packages),
            "start_up": start_up_text(),
            "layer": built_layer(),
            "benchmark": DISPATCHERS.get("toy"),
        }
    print("REPORT " + json.dumps(report))


if __name__ == "__main__":
    main()
