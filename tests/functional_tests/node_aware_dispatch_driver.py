"""Run under ``torch.distributed.run --nproc-per-node 4`` (gloo, CPU, fp32): the node-aware dispatcher
against megatron-core's alltoall dispatcher, four ranks as two "nodes" of two (and as one node of
four and four nodes of one). One launch runs every scenario (start-up dominates on a small machine):

1. the dispatchers alone, on routings built by hand (random top-3; experts that receive nothing; a
   node that receives nothing; a token's three experts on one node, over both its GPUs; top-1),
   through their six stages around a stand-in for the experts (one weight matrix per local expert,
   rows weighted by their probabilities): the experts' inputs, outputs and gradients (of the hidden
   states, probabilities and expert weights) of both, and the hidden-state rows each sends across
   nodes (counted at ``torch.distributed.all_to_all_single``) beside the routing's unique (token,
   remote node), (token, remote rank) and (token, remote expert) pairs; on two nodes of two also a
   dispatcher that sends one copy per destination *rank* (the node-aware one told every GPU is a
   node), which the row count must tell apart;
2. a 2-layer Qwen3-MoE-like model (torch-native layers) under megatron's standard 1F1B schedule, its
   combined-1F1B EP-overlap schedule, and that schedule with delayed expert wgrad: losses and
   gradients against megatron's dispatcher;
3. ``pretrain()`` of the tiny recipe at EP=4 with each dispatcher: the losses.

Rank 0 writes ``results.json`` into the directory given as the only argument.
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from megatron.bridge.training.devices import cpu_compat

HIDDEN, EXPERTS, TOKENS, EP = 16, 8, 12, 4


# ------------------------------------------------------------------------------ counting rows


class InterNodeRows:
    """Wraps ``all_to_all_single``: rows of hidden-state width (and bytes of any tensor) this rank
    sends to ranks of other nodes, per named phase."""

    def __init__(self) -> None:
        self.phase, self.gpus_per_node = None, 1
        self.rows: dict = defaultdict(int)
        self.bytes: dict = defaultdict(int)
        self._real = dist.all_to_all_single
        dist.all_to_all_single = self._counted

    def _counted(self, output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        if self.phase is not None:
            ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
            splits = (
                list(input_split_sizes)
                if input_split_sizes is not None and len(input_split_sizes)
                else ([input.shape[0] // len(ranks)] * len(ranks))
            )
            me = dist.get_rank() // self.gpus_per_node
            remote = sum(int(n) for rank, n in zip(ranks, splits) if rank // self.gpus_per_node != me)
            if input.dim() == 2 and input.shape[1] == HIDDEN:
                self.rows[self.phase] += remote
            self.bytes[self.phase] += remote * math.prod(input.shape[1:]) * input.element_size()
        return self._real(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)

    def take(self) -> dict:
        taken = {"rows": dict(self.rows), "bytes": dict(self.bytes)}
        self.rows.clear()
        self.bytes.clear()
        return taken


# ------------------------------------------------------------------------------ routings


def _pick(g: torch.Generator, allowed: list, k: int) -> list:
    return [allowed[i] for i in torch.randperm(len(allowed), generator=g)[:k].tolist()]


def _random(allowed):
    return lambda g, k, nodes: _pick(g, allowed, k)


def _one_node(g: torch.Generator, k: int, nodes: int) -> list:
    per_node = EXPERTS // nodes
    node = int(torch.randint(nodes, (1,), generator=g))
    return _pick(g, list(range(node * per_node, (node + 1) * per_node)), k)


# name: (top-k, GPUs per node, experts of each token)
CASES = {
    "random": (3, 2, _random(list(range(EXPERTS)))),
    "idle_experts": (3, 2, _random([0, 2, 3, 4, 6, 7])),  # experts 1 and 5 receive nothing
    "idle_node": (3, 2, _random([0, 1, 2, 3])),  # node 1 (experts 4-7) receives nothing
    "one_node_topk": (3, 2, _one_node),  # a token's three experts on one node, over both its GPUs
    "top1": (1, 2, _random(list(range(EXPERTS)))),
    "random_one_node": (3, 4, _random(list(range(EXPERTS)))),  # EP inside one node: one stage
    "random_gpu_nodes": (3, 1, _random(list(range(EXPERTS)))),  # one GPU per node: no hop inside
}


def routing(case: str, rank: int):
    """This rank's routing map and probabilities (zero where not routed) for ``case``."""
    topk, gpus_per_node, experts_of = CASES[case]
    g = torch.Generator().manual_seed(1000 * list(CASES).index(case) + rank)
    routing_map = torch.zeros(TOKENS, EXPERTS, dtype=torch.bool)
    for token in range(TOKENS):
        routing_map[token, experts_of(g, topk, EP // gpus_per_node)] = True
    probs = torch.rand(TOKENS, EXPERTS, generator=g) * routing_map
    return routing_map, probs


def pair_counts(routing_map: torch.Tensor, gpus_per_node: int) -> dict:
    """Unique (token, remote node), (token, remote rank) and (token, remote expert) pairs of this rank."""
    local = EXPERTS // EP
    me = dist.get_rank()
    rank_of = [e // local for e in range(EXPERTS)]
    counts = {"token_node": 0, "token_rank": 0, "token_expert": 0}
    for row in routing_map.tolist():
        ranks = {rank_of[e] for e, hit in enumerate(row) if hit and rank_of[e] // gpus_per_node != me // gpus_per_node}
        counts["token_node"] += len({r // gpus_per_node for r in ranks})
        counts["token_rank"] += len(ranks)
        counts["token_expert"] += sum(1 for e, hit in enumerate(row) if hit and rank_of[e] in ranks)
    return counts


# ------------------------------------------------------------------------------ 1. dispatchers alone


def make_dispatcher(kind: str, topk: int, gpus_per_node: int):
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron.bridge.models.torch_native.node_aware_dispatcher import NodeAwareDispatcher

    config = TransformerConfig(
        num_layers=1,
        hidden_size=HIDDEN,
        num_attention_heads=1,
        num_moe_experts=EXPERTS,
        moe_router_topk=topk,
        expert_model_parallel_size=EP,
        moe_token_dispatcher_type="alltoall",
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        add_bias_linear=False,
        moe_router_pre_softmax=True,  # megatron's rule for top-1
    )
    groups = SimpleNamespace(
        ep=ps.get_expert_model_parallel_group(),
        expt_tp=ps.get_expert_tensor_parallel_group(),
        tp_ep=ps.get_expert_tensor_and_model_parallel_group(),
    )
    local = EXPERTS // EP
    args = (local, list(range(dist.get_rank() * local, (dist.get_rank() + 1) * local)))
    if kind == "megatron":
        return MoEAlltoAllTokenDispatcher(*args, config=config, pg_collection=groups)
    if kind == "per_rank":  # every rank its own "node": one copy of a token per destination rank
        gpus_per_node = 1
    return NodeAwareDispatcher(*args, config=config, pg_collection=groups, gpus_per_node=gpus_per_node)


def experts(tokens, tokens_per_expert, probs, weights):
    """A stand-in for the experts: each local expert's rows times its matrix, weighted by their probs."""
    outs, start = [], 0
    for expert, count in enumerate(torch.as_tensor(tokens_per_expert).tolist()):
        rows = slice(start, start + count)
        outs.append((tokens[rows] @ weights[expert]) * probs[rows, None])
        start += count
    return torch.cat(outs)


def through_stages(dispatcher, counter: InterNodeRows, routing_map, probs) -> dict:
    """One forward and backward through the six stages; what the experts saw and the gradients."""
    g = torch.Generator().manual_seed(7 + dist.get_rank())
    x = torch.randn(TOKENS, HIDDEN, generator=g).requires_grad_()
    weights = torch.randn(EXPERTS // EP, HIDDEN, HIDDEN, generator=g).requires_grad_()
    probs = probs.clone().requires_grad_()
    counter.phase = "dispatch"
    tokens, p = dispatcher.dispatch_preprocess(x, routing_map, probs)
    tokens, p = dispatcher.token_dispatch(tokens, p)
    tokens, tokens_per_expert, p = dispatcher.dispatch_postprocess(tokens, p)
    counter.phase = None
    y = experts(tokens, tokens_per_expert, p, weights)
    counter.phase = "combine"
    out = dispatcher.combine_postprocess(dispatcher.token_combine(dispatcher.combine_preprocess(y)))
    counter.phase = None
    (out * torch.randn(out.shape, generator=g)).sum().backward()
    return dict(
        inputs=tokens.detach(),
        probs=p.detach(),
        tokens_per_expert=torch.as_tensor(tokens_per_expert).tolist(),
        out=out.detach(),
        grad_x=x.grad,
        grad_probs=probs.grad,
        grad_w=weights.grad,
    )


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach() - b.detach()).abs().max()) if a.numel() else 0.0


def dispatcher_cases(counter: InterNodeRows) -> dict:
    from megatron.core import parallel_state as ps

    ps.initialize_model_parallel(1, 1, expert_model_parallel_size=EP)
    report = {}
    for case, (topk, gpus_per_node, _) in CASES.items():
        routing_map, probs = routing(case, dist.get_rank())
        counter.gpus_per_node = gpus_per_node
        runs, traffic = {}, {}
        kinds = ("megatron", "node_aware", "per_rank") if gpus_per_node == 2 else ("megatron", "node_aware")
        for kind in kinds:
            runs[kind] = through_stages(make_dispatcher(kind, topk, gpus_per_node), counter, routing_map, probs)
            traffic[kind] = counter.take()
        ref, got = runs["megatron"], runs["node_aware"]
        report[case] = dict(
            same_expert_inputs=torch.equal(ref["inputs"], got["inputs"]) and torch.equal(ref["probs"], got["probs"]),
            tokens_per_expert=[ref["tokens_per_expert"], got["tokens_per_expert"]],
            diff={key: max_diff(ref[key], got[key]) for key in ("out", "grad_x", "grad_probs", "grad_w")},
            scale={key: float(ref[key].abs().max()) for key in ("out", "grad_x", "grad_probs", "grad_w")},
            traffic=traffic,
            pairs=pair_counts(routing_map, gpus_per_node),
        )
    ps.destroy_model_parallel()
    return report


# ------------------------------------------------------------------------------ 2. megatron's schedules

SEQ, MICRO_BATCHES = 16, 3
# name: (dispatcher, EP overlap, delayed wgrad)
VARIANTS = {
    "megatron": ("megatron", False, False),
    "node_aware": ("node_aware", False, False),
    "node_aware_overlap": ("node_aware", True, False),
    "node_aware_overlap_delay_wgrad": ("node_aware", True, True),
}


def _loss(out):
    loss = out.float().mean()
    return loss, {"loss": loss.detach()}


def _forward_step(it, model, return_schedule_plan=False):
    from megatron.core.utils import get_attr_wrapped_model

    tokens = next(it)
    pos = torch.arange(SEQ).unsqueeze(0)
    mask = torch.triu(torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool), diagonal=1)
    if return_schedule_plan:
        return get_attr_wrapped_model(model, "build_schedule_plan")(tokens, pos, mask, labels=tokens), _loss
    return model(tokens, pos, mask, labels=tokens), _loss


def schedule_run(dispatcher: str, overlap: bool, delay: bool):
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from megatron.bridge.models.qwen import Qwen3MoEModelProvider
    from megatron.bridge.models.torch_native.node_aware_dispatcher import NodeAwareDispatcher

    ps.initialize_model_parallel(1, 1, expert_model_parallel_size=EP)
    provider = Qwen3MoEModelProvider(
        num_layers=2,
        hidden_size=32,
        num_attention_heads=4,
        num_query_groups=2,
        kv_channels=8,
        ffn_hidden_size=64,
        moe_ffn_hidden_size=16,
        num_moe_experts=EXPERTS,
        moe_router_topk=3,
        vocab_size=128,
        seq_length=SEQ,
        make_vocab_size_divisible_by=128,
        layer_spec="torch_native",
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        bf16=True,
        expert_model_parallel_size=EP,
        moe_token_dispatcher_type="alltoall",
        torch_native_dispatcher=dispatcher,
        torch_native_gpus_per_node=2 if dispatcher == "node_aware" else None,
        overlap_moe_expert_parallel_comm=overlap,
        delay_wgrad_compute=delay,
        moe_aux_loss_coeff=0.0,
    )
    provider.finalize()
    cpu_compat.seed_cpu_model_parallel(1234)
    model = provider.provide()
    node_aware = sum(isinstance(layer.mlp.token_dispatcher, NodeAwareDispatcher) for layer in model.decoder.layers)
    g = torch.Generator().manual_seed(10 + dist.get_rank())
    data = [torch.randint(0, 128, (1, SEQ), generator=g) for _ in range(MICRO_BATCHES)]
    out = get_forward_backward_func()(
        forward_step_func=_forward_step,
        data_iterator=iter(data),
        model=[model],
        num_microbatches=MICRO_BATCHES,
        seq_length=SEQ,
        micro_batch_size=1,
        forward_only=False,
    )
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    left = sum(len(stash) for m in model.modules() for stash in getattr(m, "stashes", {}).values())
    ps.destroy_model_parallel()
    return [float(o["loss"]) for o in out], grads, node_aware, left


def schedule_cases() -> dict:
    results = {name: schedule_run(*variant) for name, variant in VARIANTS.items()}
    _, reference, _, _ = results["megatron"]
    return {
        name: dict(
            losses=losses,
            node_aware_layers=layers,
            deferred_wgrads_left=left,
            grad_diff=max(max_diff(grads[k], reference[k]) for k in reference),
            grad_scale=max(float(reference[k].detach().abs().max()) for k in reference),
            same_grad_names=sorted(grads) == sorted(reference),
        )
        for name, (losses, grads, layers, left) in results.items()
    }


# ------------------------------------------------------------------------------ 3. pretrain()

PRETRAIN_ITERS = 3


def pretrain_losses(out: Path, dispatcher: str) -> list:
    from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
    from megatron.bridge.training.pretrain import pretrain

    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.dist.device = "cpu"
    cfg.model.layer_spec = "torch_native"
    cfg.model.expert_model_parallel_size = EP
    cfg.model.torch_native_dispatcher = dispatcher
    cfg.model.torch_native_gpus_per_node = 2 if dispatcher == "node_aware" else None
    cfg.train.train_iters = PRETRAIN_ITERS
    cfg.logger.log_dir = str(out / f"pretrain_{dispatcher}")
    return pretrain(cfg).losses


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    cpu_compat.enable_cpu_compat()
    counter = InterNodeRows()
    results = {"dispatchers": dispatcher_cases(counter), "schedules": schedule_cases()}
    counter.phase = None
    results["pretrain"] = {kind: pretrain_losses(out, kind) for kind in ("megatron", "node_aware")}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, results)
    if dist.get_rank() == 0:
        (out / "results.json").write_text(json.dumps(gathered))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
