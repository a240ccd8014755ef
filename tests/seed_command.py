"""The harness's EP-overlap command exactly as the README and the harness page write it, for the
tests that run it (harness tests, perf recipes)."""

README_COMMAND = [
    "-m",
    "qwen",
    "-mr",
    "qwen3_30b_a3b",
    "--task",
    "pretrain",
    "-g",
    "h100",
    "-c",
    "bf16",
    "-ng",
    "16",
    "-gn",
    "8",
    "--max_steps",
    "8",
    "--cuda_graph_impl",
    "none",
    "--moe_flex_dispatcher_backend",
    "None",
    "--moe_a2a_overlap",
    "false",
    "--tokenizer_type",
    "NullTokenizer",
    "comm_overlap.overlap_moe_expert_parallel_comm=true",
    "comm_overlap.delay_wgrad_compute=false",
    "model.moe_shared_expert_overlap=false",
]


def for_gpu(gpu: str) -> list[str]:
    """The command with ``-g`` set to ``gpu``."""
    argv = list(README_COMMAND)
    argv[argv.index("-g") + 1] = gpu
    return argv


TINY_SIZES = [
    "model.num_layers=2",
    "model.hidden_size=128",
    "model.num_attention_heads=4",
    "model.num_query_groups=2",
    "model.kv_channels=32",
    "model.ffn_hidden_size=256",
    "model.moe_ffn_hidden_size=64",
    "model.num_moe_experts=16",
    "model.moe_router_topk=2",
    "model.vocab_size=1024",
    "model.seq_length=128",
    "dataset.num_workers=0",
]
"""Overrides that shrink the command's model to the tiny recipe's sizes (16 experts, so EP=16 holds)."""
