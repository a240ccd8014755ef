"""Where the EP ranks of the node-aware dispatcher sit, and the two kinds of process group it uses.

The node-aware dispatcher (:mod:`node_aware_dispatcher`) moves tokens in two hops: between nodes,
over the *rail* of the sending rank (the EP ranks with the same local index on every node: local
rank ``l`` of node 0, node 1, ...), then inside a node, over that node's EP ranks. Nodes are read
from global ranks: two ranks share a node where ``rank // gpus_per_node`` is the same (how torchrun
and SLURM number the ranks of a multi-node job). With expert tensor parallelism 1 an EP group is a
run of consecutive ranks, so where ``gpus_per_node`` divides the EP size each group covers whole
nodes, and where the EP size divides ``gpus_per_node`` it lies inside one node (one stage: no rail
group). Any other shape is refused: by the rules before launch, here at model build.

``torch.distributed.new_group`` is collective over the whole job: every rank must create every
group, in the same order, including groups it is not in. A rank knows only its own EP group, so the
first call all-gathers every rank's EP ranks over the default group and then creates, for every EP
group in sorted order, its node groups and then its rail groups. The groups are kept per (EP ranks,
GPUs per node), so the MoE layers of a model share them; they are made again only when the default
group changes (a process group made anew, as by a later ``pretrain()`` in the same process). Every
rank builds the same MoE layers in the same order, so all ranks find or miss the cache together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist


@dataclass(frozen=True)
class NodeLayout:
    """An EP group as ``nodes`` x ``per_node`` ranks: EP rank ``node * per_node + local``."""

    nodes: int
    per_node: int
    node: int  # this rank's node
    local: int  # this rank's index inside its node

    def ep_rank(self, node: int, local: int) -> int:
        """The EP rank of local rank ``local`` of node ``node``."""
        return node * self.per_node + local


def node_layout(ep_ranks: Sequence[int], ep_rank: int, gpus_per_node: int) -> NodeLayout:
    """The layout of the EP group whose global ranks are ``ep_ranks`` (in EP-rank order), seen from
    EP rank ``ep_rank``. Raises ``ValueError`` where the group does not split into equal runs of
    ranks, one run per node (some node would hold more of its ranks than another)."""
    node_ids = [rank // gpus_per_node for rank in ep_ranks]
    distinct = list(dict.fromkeys(node_ids))
    per_node = len(ep_ranks) // len(distinct)
    regular = per_node * len(distinct) == len(ep_ranks) and node_ids == [
        distinct[i // per_node] for i in range(len(ep_ranks))
    ]
    if not regular:
        raise ValueError(
            f"EP ranks {list(ep_ranks)} do not split into equal runs per node of {gpus_per_node} GPUs "
            "(torch_native_gpus_per_node must divide the EP size, or the EP size divide it)"
        )
    return NodeLayout(len(distinct), per_node, ep_rank // per_node, ep_rank % per_node)


@dataclass(frozen=True)
class NodeGroups:
    """This rank's groups for the two hops, and where it sits."""

    layout: NodeLayout
    inter: dist.ProcessGroup | None
    """The rail: the EP ranks with this rank's local index, one per node (``None`` with one node)."""
    intra: dist.ProcessGroup | None
    """This rank's node (``None`` with one EP rank per node)."""


_GROUPS: dict[tuple[tuple[int, ...], int], NodeGroups | None] = {}
_MADE_UNDER: list[Any] = [None]  # the default group the cached groups were made under


def node_groups(ep_group: dist.ProcessGroup, gpus_per_node: int) -> NodeGroups:
    """This rank's :class:`NodeGroups` for ``ep_group`` (collective over the job the first time)."""
    world = dist.group.WORLD
    if _MADE_UNDER[0] is not world:
        _GROUPS.clear()
        _MADE_UNDER[0] = world
    key = (tuple(dist.get_process_group_ranks(ep_group)), gpus_per_node)
    if key not in _GROUPS:
        _make_every_group(key[0], gpus_per_node)
    groups = _GROUPS[key]
    if groups is None:
        raise RuntimeError(f"rank {dist.get_rank()} is not in its own EP group {list(key[0])}")
    return groups


def rail_ranks(ep_ranks: Sequence[int], layout: NodeLayout) -> list[tuple[int, ...]]:
    """Global ranks of each rail of the EP group: local index ``l`` of every node, in node order."""
    return [tuple(ep_ranks[local :: layout.per_node]) for local in range(layout.per_node)]


def node_ranks(ep_ranks: Sequence[int], layout: NodeLayout) -> list[tuple[int, ...]]:
    """Global ranks of each node of the EP group, in node order."""
    size = layout.per_node
    return [tuple(ep_ranks[node * size : (node + 1) * size]) for node in range(layout.nodes)]


def _every_ep_group(mine: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every rank's EP group, gathered over the default group, each once, sorted."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return sorted({tuple(ranks) for ranks in gathered})


def _make_every_group(mine: tuple[int, ...], gpus_per_node: int) -> None:
    """Create the node and rail groups of every EP group of the job, in one order on every rank,
    and keep this rank's (a rank outside an EP group keeps ``None`` under its key)."""
    me = dist.get_rank()
    for ranks in _every_ep_group(mine):
        shape = node_layout(ranks, 0, gpus_per_node)
        intra = _new_groups(node_ranks(ranks, shape) if shape.per_node > 1 else [], me, "ep_intra_node")
        inter = _new_groups(rail_ranks(ranks, shape) if shape.nodes > 1 else [], me, "ep_inter_node")
        layout = node_layout(ranks, ranks.index(me), gpus_per_node) if me in ranks else None
        _GROUPS[(ranks, gpus_per_node)] = None if layout is None else NodeGroups(layout, inter, intra)


def _new_groups(rank_lists: Sequence[tuple[int, ...]], me: int, desc: str) -> dist.ProcessGroup | None:
    """Create a group for every rank list (collective: every rank calls this with the same lists),
    described as ``desc`` (what NCCL's logs and an emulated world's record call it); returns the one
    ``me`` belongs to."""
    found = None
    for ranks in rank_lists:
        group = dist.new_group(list(ranks), group_desc=desc)
        if me in ranks:
            found = group
    return found


__all__ = ["NodeGroups", "NodeLayout", "node_groups", "node_layout", "node_ranks", "rail_ranks"]
