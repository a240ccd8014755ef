"""The emulated world against a real one, and its record against the network model worked out by hand.

(a) A real two-process EP=2 run over gloo whose ranks read the same micro-batches, and the emulated
EP=2 run: the same collectives (kind, megatron-core group, bytes, in order) in a training step, the
same number of tokens for every local-expert call, finite losses. (b) One step of the tiny recipe
as rank 0 of an emulated EP=4 / DP=4 world, one GPU per node on ``h100_ib400``: every group's calls
and bytes as the layout predicts them, and every modeled time as the model's formula gives it.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from megatron.bridge.emulation.network import PRESETS

pytestmark = pytest.mark.functional

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("emulation_parity_driver.py")
H100 = PRESETS["h100_ib400"]


def _run(*argv: str, cwd: Path) -> None:
    proc = subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("emulation")
    _run("-m", "torch.distributed.run", "--nproc-per-node", "2", str(DRIVER), "real", str(out), cwd=out)
    _run(str(DRIVER), "emulated", str(out), cwd=out)
    _run(str(DRIVER), "record", str(out), cwd=out)
    return {name: json.loads((out / f"{name}.json").read_text()) for name in ("real", "emulated", "record")}


def test_the_emulated_rank_issues_what_a_real_rank_issues(runs):
    real, emulated = runs["real"], runs["emulated"]
    assert emulated["calls"] == real["calls"] and len(real["calls"]) > 20
    assert {call[1] for call in real["calls"]} >= {"ep", "tp_ep", "dp_cp"}


def test_every_local_expert_gets_the_tokens_it_gets_in_a_real_world(runs):
    assert runs["emulated"]["expert_tokens"] == runs["real"]["expert_tokens"]
    assert len(runs["real"]["expert_tokens"]) == 2 and all(sum(call) for call in runs["real"]["expert_tokens"])


def test_emulated_losses_are_finite(runs):
    assert all(math.isfinite(loss) for loss in runs["emulated"]["losses"] + runs["record"].get("losses", []))


# (group, kind) -> (calls, bytes) for one step of the tiny recipe (2 layers, 8 experts of which 2 per
# rank, 2 micro-batches) as rank 0 of EP=4 / DP=4; None: the bytes depend on the routing or on the
# parameter buffers' padding, and are checked through the modeled time only.
LAYERS, MICRO_BATCHES, RANKS, EXPERTS = 2, 2, 4, 8
BY_HAND = {
    ("ep[4]", "all_to_all"): (LAYERS * MICRO_BATCHES * 6, None),  # tokens, probabilities, combine; forward and backward
    ("tp_ep[4]", "all_gather"): (LAYERS * MICRO_BATCHES, LAYERS * MICRO_BATCHES * RANKS * EXPERTS * 8),  # int64 counts
    ("dp_cp[4]", "all_gather"): (2, None),  # the distributed optimizer's parameter gathers
    ("dp_cp[4]", "reduce_scatter"): (1, None),  # the gradient buffer, once per step
    ("edp[1]", "all_gather"): (2, None),
    ("edp[1]", "reduce_scatter"): (1, None),
    ("dist_opt[4]", "all_reduce"): (3, 12),  # float32 scalars of the optimizer step
    ("world[4]", "all_reduce"): (2, 24),
}


@pytest.mark.parametrize("group, kind", sorted(BY_HAND))
def test_a_steps_record_is_what_the_network_model_gives_by_hand(runs, group, kind):
    tally = runs["record"]["groups"][group][kind]
    calls, nbytes = BY_HAND[(group, kind)]
    assert tally["calls"] == calls and (nbytes is None or tally["bytes"] == nbytes), tally
    size = int(group.split("[")[1].rstrip("]"))
    if size == 1:
        assert tally["modeled_s"] == 0.0
        return
    latency, bandwidth = H100.inter_node_latency_us * 1e-6, H100.inter_node_gbps * 1e9  # one GPU per node
    factor = {
        "all_to_all": 1.0,
        "all_gather": (size - 1) / size,
        "reduce_scatter": (size - 1) / size,
        "all_reduce": 2 * (size - 1) / size,
    }[kind]
    assert tally["modeled_s"] == pytest.approx(calls * latency + factor * tally["bytes"] / bandwidth, rel=1e-9)


def test_the_gradient_reduce_scatter_moves_twice_a_parameter_gather(runs):
    """float32 gradients, bfloat16 parameters: one gradient buffer is two parameter gathers' bytes."""
    groups = runs["record"]["groups"]["dp_cp[4]"]
    assert groups["reduce_scatter"]["bytes"] == groups["all_gather"]["bytes"]


# (d) The CPU command for the emulated world, as the README and docs/README.md's index write it: an
# overlap off/on sweep of EP=16 over two emulated nodes, whose tables and plot say what they show.
def readme_emulated_cpu_command() -> list[str]:
    """The README's harness command with ``--emulate`` and ``-g cpu`` (continued lines joined)."""
    text = re.sub(r"\\\n\s*", "", (REPO / "README.md").read_text())
    for line in text.splitlines():
        if (
            line.startswith("uv run python scripts/performance/run_script.py")
            and "--emulate" in line
            and "-g cpu" in line
        ):
            return shlex.split(line)[3:]  # after "uv run python"
    raise AssertionError("the README has no CPU command for the emulated world")


def test_the_readmes_cpu_command_for_the_emulated_world_runs_as_written(tmp_path):
    argv = readme_emulated_cpu_command()
    index = " ".join((REPO / "docs" / "README.md").read_text().split())
    assert f"`uv run python {shlex.join(argv)}`" in index  # the index gives the same command
    proc = subprocess.run(
        [sys.executable, *argv, "-l", str(tmp_path / "sweep")], cwd=REPO, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert proc.stdout.count("EMULATED world: this process plays rank 0 of 16 (2 node(s) x 8 GPUs)") == 2
    tables = proc.stdout.split("Results")[1:]
    assert len(tables) == 2 and all("EMULATED" in t and "'h100_ib400'" in t for t in tables), tables
    for sub in ("00_overlap_moe_expert_parallel_comm=false", "01_overlap_moe_expert_parallel_comm=true"):
        summary = json.loads((tmp_path / "sweep" / sub / "summary.json").read_text())
        assert summary["emulation"]["emulated"] and summary["emulation"]["network"]["name"] == "h100_ib400"
        assert "modeled, not measured" in summary["emulation"]["note"]
        assert summary["final_iteration"] == len(summary["emulation"]["steps"]) > 0
        assert all(step["modeled_s"] > 0 for step in summary["emulation"]["steps"])
    md = (tmp_path / "sweep" / "sweep.md").read_text()
    assert "EMULATED" in md and "'h100_ib400'" in md and "modeled comm (s)" in md and "gloo" not in md, md
    assert (tmp_path / "sweep" / "sweep.png").read_bytes()[:4] == b"\x89PNG"


# (e) The sorted dispatcher over NVSHMEM, emulated: its exchanges are charged one call per peer in turn.
def test_the_sorted_dispatchers_nvshmem_exchange_runs_emulated_and_is_charged_one_call_per_peer(tmp_path):
    from seed_command import TINY_SIZES, for_gpu

    script = Path(__file__).resolve().parents[2] / "scripts" / "performance" / "run_script.py"
    argv = [
        *for_gpu("cpu"),
        "--emulate",
        "--network",
        "h100_ib400",
        *TINY_SIZES,
        "--max_steps",
        "2",
        "-gb",
        "32",
        "model.torch_native_dispatcher=sorted",
        "model.torch_native_ep_transport=nvshmem",
    ]
    proc = subprocess.run(
        [sys.executable, str(script), *argv, "-l", str(tmp_path / "run")], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "sorted dispatcher, sync-free, transport: nvshmem (EP=16, NVSHMEM EMULATED" in proc.stdout
    step = json.loads((tmp_path / "run" / "summary.json").read_text())["emulation"]["steps"][-1]
    ep = step["groups"]["ep[16]"]
    layers, micro_batches = 2, 32 // 16
    exchanges = ep["all_to_all"]
    assert exchanges["calls"] == layers * micro_batches * 4  # dispatch and combine, forward and backward
    # 15 calls an exchange, each a team-wide barrier (the group spans nodes) and its slowest pair: ranks paired
    # by XOR, 7 calls inside a node (NVLink) and 8 across the NIC (what a pair sends follows the routing: the
    # unit tests price it exactly)
    barriers = 15 * H100.inter_node_latency_us
    pairs = 7 * H100.intra_node_latency_us + 8 * H100.inter_node_latency_us
    least = exchanges["calls"] * (barriers + pairs) * 1e-6
    assert least < exchanges["modeled_s"] < 2 * least
    counts = ep["all_gather"]  # 16 int64 expert counts: one 128-byte row to each of 15 peers, 8 over the NIC
    calls = layers * micro_batches
    assert (counts["calls"], counts["bytes"], counts["inter_node_bytes"]) == (calls, calls * 15 * 128, calls * 8 * 128)
