"""The harness's EP-overlap command exactly as the README and the harness page write it, for the
tests that run it (harness tests, perf recipes)."""

README_COMMAND = [
    "-m", "qwen", "-mr", "qwen3_30b_a3b", "--task", "pretrain", "-g", "h100", "-c", "bf16",
    "-ng", "16", "-gn", "8", "--max_steps", "8", "--cuda_graph_impl", "none",
    "--moe_flex_dispatcher_backend", "None", "--moe_a2a_overlap", "false",
    "--tokenizer_type", "NullTokenizer",
    "comm_overlap.overlap_moe_expert_parallel_comm=true",
    "comm_overlap.delay_wgrad_compute=false",
    "model.moe_shared_expert_overlap=false",
]


def for_gpu(gpu: str) -> list[str]:
    """The command with ``-g`` set to ``gpu``."""
    argv = list(README_COMMAND)
    argv[argv.index("-g") + 1] = gpu
    return argv
