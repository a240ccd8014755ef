"""``docs/extending.md``, step by step: a toy extension of each kind, made the way the guide says, and
the product finding it through its real entry points (the harness's ``main``, ``cfg.validate()``, the
docs generators, the ranks' config loader, the FLOPs counter).

A test cannot write into ``src/``, so it stands in for the guide's edits in two ways, and each test
first checks that the code still has the shape the stand-in assumes (so a moved registry fails here):

* "create ``<package>/<name>/...``": the files are written into a temporary folder that is appended
  to the package's ``__path__``; Python finds them there exactly as in the package's own folder.
* "add an entry to the table ``NAME`` of ``module.py``": ``NAME`` is rebound to the table with the
  entry, in its module and in every loaded ``megatron.bridge`` module that imported it by name, which
  is what importing the edited module would give.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import megatron.bridge.models as models_package
import megatron.bridge.perf.harness.execution as execution_module
import megatron.bridge.recipes as recipes_package
from megatron.bridge.models.dispatch import node_aware, path_registry
from megatron.bridge.models.dispatch.path_registry import choose_dispatch
from megatron.bridge.perf.benchmarks.benchmark_jobs import write_configs
from megatron.bridge.perf.harness.argument_parser import parse_args
from megatron.bridge.perf.harness.config_builder import HarnessError, build_config
from megatron.bridge.perf.harness.job import make_job
from megatron.bridge.perf.harness.recipe_lookup import RECIPES_PACKAGE, available_families
from megatron.bridge.perf.harness.run import main
from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.config_stages.resolution import overlap_docs
from megatron.bridge.training.config_stages.rules import registry
from megatron.bridge.training.config_stages.schema import field_ranges as ranges
from megatron.bridge.training.config_stages.schema.field_ranges import FieldRange
from megatron.bridge.training.config_stages.schema.rule_base import Rule
from megatron.bridge.training.errors import ConfigError, ConfigValidationError
from megatron.bridge.training.telemetry import flops

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "extending.md"
CHILDREN = Path(__file__).parent / "children"
OTHER_PROBLEM = ("optimizer.lr", -1.0, "range:optimizer.lr")
"""A second, unrelated problem each toy rule's config also has: ``validate()`` lists both at once."""


# --------------------------------------------------------------------------------------------- fixtures
@pytest.fixture
def add_package(tmp_path: Path, monkeypatch) -> Iterator[Callable[[Any, str, dict[str, str]], None]]:
    """``add(package, name, files)``: the sub-package ``<package>.<name>`` made of ``files`` (file name
    -> source), as if it were a folder in ``package``'s directory; gone again after the test."""
    added: list[str] = []

    def add(package: Any, name: str, files: dict[str, str]) -> None:
        folder = tmp_path / f"{package.__name__}.ext" / name
        folder.mkdir(parents=True)
        for filename, source in files.items():
            (folder / filename).write_text(textwrap.dedent(source))
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder.parent)])
        importlib.invalidate_caches()
        added.append(f"{package.__name__}.{name}")

    yield add
    for full in added:
        parent, _, name = full.rpartition(".")
        for key in [k for k in sys.modules if k == full or k.startswith(full + ".")]:
            del sys.modules[key]
        if hasattr(sys.modules[parent], name):
            delattr(sys.modules[parent], name)
    gc.collect()  # the toy provider classes leave GPTModelProvider.__subclasses__()


@pytest.fixture
def rebind(monkeypatch) -> Callable[[Any, Any], None]:
    """``rebind(old, new)``: every module-level name of a loaded ``megatron.bridge`` module bound to
    ``old`` now holds ``new`` (as importing an edited module would give), undone after the test."""

    def swap(old: Any, new: Any) -> None:
        assert old, "an empty table cannot be told apart from other empty tables"
        found = 0
        for module in list(sys.modules.values()):
            if not getattr(module, "__name__", "").startswith("megatron.bridge"):
                continue
            for name, value in list(vars(module).items()):
                if value is old:
                    monkeypatch.setattr(module, name, new)
                    found += 1
        assert found, "nothing holds the table the guide names: did it move?"

    return swap


@pytest.fixture
def add_rules(rebind) -> Callable[..., None]:
    """``add_rules(table, *rules)``: the guide's "add a Rule to a table of the registry": the table
    ``registry.RULE_TABLES[table]`` with ``rules`` appended, and ``ALL_RULES`` built from the tables
    as ``registry.py`` builds it."""

    def add(table: str, *rules: Rule) -> None:
        def built(tables: dict) -> tuple:
            return tuple(rule for rules_of in tables.values() for rule in rules_of)

        assert registry.ALL_RULES == built(registry.RULE_TABLES), "registry.py no longer builds ALL_RULES so"
        old = registry.RULE_TABLES[table]
        tables = {**registry.RULE_TABLES, table: old + rules}
        all_rules = built(tables)
        rebind(registry.ALL_RULES, all_rules)
        rebind(registry.RULE_TABLES, tables)
        rebind(old, tables[table])

    return add


@pytest.fixture
def no_launch(monkeypatch) -> None:
    """Any launch fails the test: what is refused must be refused before anything starts."""

    def refuse(*args, **kwargs):
        raise AssertionError("launched although the harness should have refused before launch")

    monkeypatch.setattr(execution_module, "run_plan", refuse)


def harness(argv: list[str]) -> tuple[int, str]:
    """``scripts/performance/run_script.py`` in-process: its exit code and output."""
    out = io.StringIO()
    return main(argv, out=out), out.getvalue()


def test_the_guide_exists_and_names_this_test_file():
    assert "tests/unit_tests/test_extending_guide.py" in GUIDE.read_text()


# --------------------------------------------------------------------------------------- (1) a recipe
TOY_RECIPES = {
    "__init__.py": '''\
        """Toy MoE recipes: docs/extending.md, "Add a recipe"."""

        from megatron.bridge.recipes.toy_family.toy_moe import toy_moe_pretrain_4gpu_config, toy_moe_pretrain_config

        __all__ = ["toy_moe_pretrain_config", "toy_moe_pretrain_4gpu_config"]
        ''',
    "toy_moe.py": '''\
        """The tiny Qwen3-MoE shape on EP=2 (EP=4 for four GPUs)."""

        from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
        from megatron.bridge.recipes.qwen.qwen3_moe import written_for_gpus
        from megatron.bridge.training.config import ConfigContainer


        @written_for_gpus(2)
        def toy_moe_pretrain_config() -> ConfigContainer:
            cfg = qwen3_moe_tiny_pretrain_config()
            cfg.model.expert_model_parallel_size = 2
            cfg.train.global_batch_size = 16
            return cfg


        def toy_moe_pretrain_4gpu_config() -> ConfigContainer:
            cfg = toy_moe_pretrain_config()
            cfg.model.expert_model_parallel_size = 4
            return cfg


        def toy_unlisted_pretrain_config() -> ConfigContainer:  # not bound in __init__.py: not offered
            return toy_moe_pretrain_config()
        ''',
}


@pytest.fixture
def toy_recipes(add_package) -> str:
    """The family ``toy_family`` under ``megatron.bridge.recipes``, laid out as ``recipes/qwen``."""
    assert recipes_package.__name__ == RECIPES_PACKAGE, "the harness looks for recipes elsewhere now"
    add_package(recipes_package, "toy_family", TOY_RECIPES)
    return "toy_family"


@pytest.mark.parametrize(
    "mr, extra, code, shown",
    [
        ("toy_moe", [], 0, "recipe megatron.bridge.recipes.toy_family.toy_moe_pretrain_config; 2 GPUs"),
        ("toy_moe", ["-ng", "4"], 0, "recipe megatron.bridge.recipes.toy_family.toy_moe_pretrain_4gpu_config; 4 GPUs"),
        ("toy_unlisted", [], 2, "no recipe 'toy_unlisted_pretrain_config'"),
    ],
    ids=["generic", "gpu-count-variant", "defined-but-not-bound-in-init"],
)
def test_a_recipe_bound_in_its_family_package_is_found_by_the_harness(toy_recipes, tmp_path, mr, extra, code, shown):
    assert toy_recipes in available_families()
    got, out = harness(
        [
            "-m",
            toy_recipes,
            "-mr",
            mr,
            "--task",
            "pretrain",
            "--dryrun",
            "-l",
            str(tmp_path / "x"),
            "-g",
            "h100",
            *extra,
        ]
    )
    assert got == code, out
    assert shown in out, out
    if code:
        assert "-mr toy_moe --task pretrain" in out  # the refusal lists what the family offers


def test_a_yaml_file_under_recipes_is_an_overlay_of_a_python_recipe(tmp_path):
    """YAML under ``recipes/`` is applied with ``--config_file`` over the ``-mr`` recipe, not named by ``-mr``."""
    overlay = tmp_path / "toy_overlay.yaml"
    overlay.write_text("model:\n  expert_model_parallel_size: 2\n")
    code, out = harness(
        [
            "-mr",
            "qwen3_moe_tiny",
            "--config_file",
            str(overlay),
            "-g",
            "h100",
            "-ng",
            "2",
            "--dryrun",
            "-l",
            str(tmp_path / "x"),
        ]
    )
    assert code == 0, out
    assert re.search(r"model\.expert_model_parallel_size\s+= 2  \[yaml\]", out), out


# ----------------------------------------------------------------------------------- (2) a validation rule
TOY_RULE = Rule(
    id="toy-seq-length-multiple-of-64",
    fields=("model.seq_length",),
    holds=lambda cfg, ctx: cfg.model.seq_length % 64 == 0,
    message="the toy kernel works on tiles of 64 tokens",
    fix="set model.seq_length to a multiple of 64 (e.g. 128)",
)
TOY_OVERLAP_RULE = Rule(
    id="toy-ep-overlap-needs-even-layers",
    group="toy",
    fields=("comm_overlap.overlap_moe_expert_parallel_comm", "model.num_layers"),
    applies=lambda cfg, ctx: bool(cfg.comm_overlap.overlap_moe_expert_parallel_comm),
    holds=lambda cfg, ctx: cfg.model.num_layers % 2 == 0,
    message="the toy schedule overlaps layers in pairs",
    fix="use an even model.num_layers, or comm_overlap.overlap_moe_expert_parallel_comm=false",
)
TOY_RANGE = FieldRange("model.rotary_base", low=0, low_inclusive=False, why="toy: the RoPE angles divide by it")


def _general(add_rules, rebind) -> None:
    add_rules("general", TOY_RULE)


def _overlap(add_rules, rebind) -> None:
    from megatron.bridge.training.config_stages.rules import overlap_rules

    assert registry.RULE_TABLES["overlap"] is overlap_rules.OVERLAP_RULES
    add_rules("overlap", TOY_OVERLAP_RULE)  # OVERLAP_RULES, and the docs page's view of it, with the rule


def _range(add_rules, rebind) -> None:
    assert {r.rule_id for r in ranges.RANGES} <= {r.id for r in registry.ALL_RULES}, "ranges are not rules now"
    rebind(ranges.RANGES, ranges.RANGES + (TOY_RANGE,))
    add_rules("general", TOY_RANGE.rule())  # RANGE_RULES is built from RANGES into the "general" table


def _breaks_overlap_toy(cfg: ConfigContainer) -> None:
    cfg.model.expert_model_parallel_size = 2
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = True
    cfg.model.num_layers = 3


RULE_CASES = {
    "general-table": (
        _general,
        "toy-seq-length-multiple-of-64",
        lambda cfg: setattr(cfg.model, "seq_length", 100),
        None,
    ),
    "overlap-table": (
        _overlap,
        "toy-ep-overlap-needs-even-layers",
        _breaks_overlap_toy,
        lambda: overlap_docs.render_docs(),
    ),
    "range-row": (
        _range,
        "range:model.rotary_base",
        lambda cfg: setattr(cfg.model, "rotary_base", -1.0),
        lambda: ranges.ranges_markdown(),
    ),
}
"""Where the toy rule goes -> (how the guide adds it, its id, a change that breaks it, the generator of
its docs table or ``None`` where no page is generated from that table)."""


@pytest.mark.parametrize("where", sorted(RULE_CASES))
def test_a_rule_added_to_the_registry_is_enforced_with_every_other_problem(where, add_rules, rebind):
    add, rule_id, breaks, _ = RULE_CASES[where]
    add(add_rules, rebind)
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.validate()  # the toy rule holds on the recipe as it is
    breaks(cfg)
    field, value, other_id = OTHER_PROBLEM
    setattr(cfg.optimizer, field.split(".")[1], value)
    with pytest.raises(ConfigValidationError) as info:
        cfg.validate()
    found = {v.rule: v for v in info.value.violations}
    assert {rule_id, other_id} <= set(found), str(info.value)
    toy = found[rule_id]
    text = str(info.value)
    assert f"[{rule_id}]" in text and f"fix: {toy.fix}" in text and f"{toy.fields[-1]}=" in text


@pytest.mark.parametrize("where", sorted(RULE_CASES))
def test_a_rule_appears_in_the_page_generated_from_its_table(where, add_rules, rebind):
    add, rule_id, _, render = RULE_CASES[where]
    add(add_rules, rebind)
    pages = {"overlap": overlap_docs.render_docs(), "ranges": ranges.ranges_markdown()}
    if render is None:  # the guide says so: general tables have no generated page
        assert all(rule_id not in page for page in pages.values())
        return
    text = render()
    shown = f"`{TOY_RANGE.field}`" if rule_id.startswith("range:") else f"`{rule_id}`"
    assert shown in text
    row = next(line for line in text.splitlines() if line.startswith(f"| {shown}"))
    assert (TOY_RANGE.why if rule_id.startswith("range:") else TOY_OVERLAP_RULE.fix) in row


# ------------------------------------------------------------------------------------- (3) a model family
TOY_MODELS = {
    "__init__.py": '''\
        """Toy MoE family: docs/extending.md, "Add a model family"."""

        from megatron.bridge.models.toy_family.toy_moe_provider import ToyMoEModelProvider

        __all__ = ["ToyMoEModelProvider"]
        ''',
    "toy_moe_provider.py": '''\
        """A toy architecture: RMSNorm, SwiGLU, no biases, 4 experts top-2."""

        from dataclasses import dataclass
        from typing import Callable, Optional

        import torch
        import torch.nn.functional as F

        from megatron.bridge.models.gpt_provider import GPTModelProvider


        @dataclass
        class ToyMoEModelProvider(GPTModelProvider):
            normalization: str = "RMSNorm"
            activation_func: Callable[[torch.Tensor], torch.Tensor] = F.silu
            gated_linear_unit: bool = True
            add_bias_linear: bool = False
            bias_activation_fusion: bool = False
            bias_dropout_fusion: bool = False
            masked_softmax_fusion: bool = False
            persist_layer_norm: bool = False
            apply_rope_fusion: bool = False
            gradient_accumulation_fusion: bool = False
            num_layers: int = 2
            hidden_size: int = 64
            num_attention_heads: int = 4
            num_query_groups: Optional[int] = 2
            kv_channels: Optional[int] = 16
            ffn_hidden_size: Optional[int] = 128
            num_moe_experts: Optional[int] = 4
            moe_router_topk: int = 2
            moe_ffn_hidden_size: Optional[int] = 32
            moe_grouped_gemm: bool = True
            moe_token_dispatcher_type: str = "alltoall"
            vocab_size: Optional[int] = 512
            seq_length: int = 128
        ''',
    "unlisted_provider.py": '''\
        """A provider that the family's __init__.py does not import."""

        from dataclasses import dataclass

        from megatron.bridge.models.toy_family.toy_moe_provider import ToyMoEModelProvider


        @dataclass
        class UnlistedProvider(ToyMoEModelProvider):
            pass
        ''',
}
TOY_MODEL_RECIPES = {
    "__init__.py": """\
        from megatron.bridge.recipes.toy_models.toy import toy_arch_pretrain_config

        __all__ = ["toy_arch_pretrain_config"]
        """,
    "toy.py": """\
        from megatron.bridge.models.toy_family import ToyMoEModelProvider
        from megatron.bridge.recipes.qwen import qwen3_moe_tiny_pretrain_config
        from megatron.bridge.training.config import ConfigContainer


        def toy_arch_pretrain_config() -> ConfigContainer:
            cfg = qwen3_moe_tiny_pretrain_config()  # its training sections; the model is the toy family's
            cfg.model = ToyMoEModelProvider(expert_model_parallel_size=2)
            return cfg
        """,
}


@pytest.fixture
def toy_model_family(add_package) -> None:
    """``models/toy_family`` (a provider) and a recipe family whose recipe builds it."""
    add_package(models_package, "toy_family", TOY_MODELS)
    add_package(recipes_package, "toy_models", TOY_MODEL_RECIPES)


@pytest.mark.parametrize(
    "target, accepted",
    [
        ("megatron.bridge.models.toy_family.toy_moe_provider.ToyMoEModelProvider", True),
        ("megatron.bridge.models.toy_family.unlisted_provider.UnlistedProvider", False),
    ],
    ids=["imported-by-the-family", "never-imported"],
)
def test_a_model_family_reaches_the_ranks_through_the_config_they_load(toy_model_family, tmp_path, target, accepted):
    args = parse_args(["-m", "toy_models", "-mr", "toy_arch", "-g", "h100", "-ng", "2", "-l", str(tmp_path / "run")])
    job = make_job(build_config(args), args)  # resolved and validated, as for a launch
    assert type(job.resolved.model).__name__ == "ToyMoEModelProvider"
    written = tmp_path / "config.yaml"
    written.write_text(
        job.config_text.replace("megatron.bridge.models.toy_family.toy_moe_provider.ToyMoEModelProvider", target)
    )
    if accepted:
        loaded = ConfigContainer.from_yaml(written)  # what megatron.bridge.training.entry does on each rank
        assert f"{type(loaded.model).__module__}.{type(loaded.model).__qualname__}" == target
        assert loaded.model.num_moe_experts == 4 and loaded.model.expert_model_parallel_size == 2
        return
    with pytest.raises(ConfigError, match=r"\[config-target-not-allowed\]"):
        ConfigContainer.from_yaml(written)


def test_every_family_exported_by_the_models_package_is_known_to_the_ranks(tmp_path):
    """A fresh process, as a rank starts: a provider re-exported from ``megatron.bridge.models`` (the
    guide's last step of a family) is a ``_target_`` its config may name."""
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(CHILDREN / "rank_side_providers.py")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("REPORT "))[len("REPORT ") :])
    assert report["exported"] and set(report["exported"]) <= set(report["allowed"])


# ------------------------------------------------------------------------- (4) a dispatcher or flex backend
@pytest.mark.parametrize(
    "extra, rule",
    [
        (["model.torch_native_dispatcher=toy"], "model.torch_native_dispatcher expects one of"),
        (
            ["model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=toyep"],
            "model.moe_flex_dispatcher_backend expects one of",
        ),
    ],
    ids=["torch-native-dispatcher", "flex-backend"],
)
def test_an_unknown_dispatcher_name_is_refused_by_the_harness_before_launch(no_launch, tmp_path, extra, rule):
    code, out = harness(
        ["-mr", "qwen3_moe_tiny", "-g", "h100", "-ng", "2", "-ep", "2", "-l", str(tmp_path / "r"), *extra]
    )
    assert code == 2 and "[override-type]" in out and rule in out and "nothing was launched" in out, out


@pytest.mark.parametrize(
    "fields, rule",
    [
        ({"torch_native_dispatcher": "toy"}, "torch-native-dispatcher-known"),
        ({"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "toyep"}, "flex-backend-known"),
    ],
    ids=["torch-native-dispatcher", "flex-backend"],
)
def test_an_unknown_dispatcher_name_set_in_python_is_refused_by_validate(fields, rule):
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.model.expert_model_parallel_size = 2
    for name, value in fields.items():
        setattr(cfg.model, name, value)
    with pytest.raises(ConfigValidationError, match=rf"\[{rule}\]"):
        cfg.validate()


def test_a_torch_native_value_whose_paths_cannot_choose_is_refused_by_choose_dispatch(monkeypatch):
    """A path that names a ``torch_native_dispatcher`` value but gives the layer no ``choose``."""
    mute = dataclasses.replace(node_aware.PATH, torch_native_value="toy", choose=None)
    monkeypatch.setattr(path_registry, "DISPATCH_PATHS", (*path_registry.DISPATCH_PATHS, mute))
    model = qwen3_moe_tiny_pretrain_config().model
    model.torch_native_dispatcher = "toy"
    with pytest.raises(ValueError, match="'toy' has no dispatcher in choose_dispatch"):
        choose_dispatch(model, 1, 1, None, torch.device("cpu"))


TOY_PATHS = CHILDREN / "toy_dispatch_paths"
"""The guide's toy paths: ``toy_dispatch.py`` (torch-native) and ``toyep.py`` (a flex backend)."""
DISPATCH = Path("megatron") / "bridge" / "models" / "dispatch"


def add_registry_line(registry: str, module: str) -> str:
    """``path_registry.py`` with ``module``'s line in ``DISPATCH_PATHS`` (and its name in the import
    of the path modules above it), as the guide says."""
    imports = registry.index("from megatron.bridge.models.dispatch import (")
    close = registry.index(")", imports)
    registry = registry[:close] + f"    {module},\n" + registry[close:]
    listed = registry.index("DISPATCH_PATHS: tuple[DispatchPath, ...] = (")
    close = registry.index("\n)", listed) + 1
    return registry[:close] + f"    {module}.PATH,\n" + registry[close:]


@pytest.fixture(scope="module")
def toy_paths_report(tmp_path_factory) -> dict:
    """The source tree copied, each toy path added to it as one module and its registry line, and
    what the product then says (``children/toy_dispatch_report.py``)."""
    root = tmp_path_factory.mktemp("tree")
    shutil.copytree(ROOT / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__"))
    registry = root / "src" / DISPATCH / "path_registry.py"
    before = registry.read_text()
    for module in ("toy_dispatch", "toyep"):
        shutil.copy(TOY_PATHS / f"{module}.py", root / "src" / DISPATCH / f"{module}.py")
        registry.write_text(add_registry_line(registry.read_text(), module))
    added = [line for line in registry.read_text().splitlines() if line not in before.splitlines()]
    assert added == ["    toy_dispatch,", "    toyep,", "    toy_dispatch.PATH,", "    toyep.PATH,"]
    logs = tmp_path_factory.mktemp("logs")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root / "src"), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, str(CHILDREN / "toy_dispatch_report.py"), str(logs)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=root,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("REPORT "))[len("REPORT ") :])


def test_a_dispatch_path_is_a_field_choice_and_a_harness_choice(toy_paths_report):
    fields, flag = toy_paths_report["fields"], toy_paths_report["harness"]
    assert fields["torch_native"][-1] == "toy" and fields["flex"][-1] == "toyep"
    assert fields["overridden"] == ["toy", "toyep"]  # the dotted overrides' type check takes them
    assert flag["taken"] == "toyep" and "deepep|hybridep|ncclep|toyep:" in flag["help"]


@pytest.mark.parametrize(
    "run, code, shown",
    [
        (
            "flex_on_blackwell",
            0,
            [
                "dispatcher: flex, backend toyep (toy settings, SMs: backend default)",
                "note: toy_ep_kernels does not import on this CPU host",
            ],
        ),
        ("flex_on_hopper", 2, ["[flex-backend-supported-on-gpu]", "ToyEP is only applicable to Blackwell GPUs"]),
        ("flex_rule", 2, ["[toyep-needs-even-experts] ToyEP pairs experts"]),
        ("toy_rule", 2, ["[toy-dispatch-needs-one-ep-rank] the toy dispatcher exchanges nothing"]),
    ],
)
def test_a_dispatch_path_s_gpus_packages_rules_and_start_up_text_reach_the_harness(toy_paths_report, run, code, shown):
    got = toy_paths_report[run]
    assert got["code"] == code and all(text in got["out"] for text in shown), got["out"]


def test_a_dispatch_path_is_in_the_docs_the_probes_the_layer_and_the_benchmark(toy_paths_report):
    report = toy_paths_report
    assert report["docs"]["support_table_header"].endswith("| toyep |")
    assert "| `toyep-needs-even-experts` | flex-settings |" in report["docs"]["overlap_page"]
    assert report["probed"]["toy_ep_kernels"] is False  # the described host was asked for its package
    assert report["start_up"]["flex"] == "flex, backend toyep (toy settings, SMs: backend default)"
    assert report["layer"] == {"dispatcher": "ToyDispatcher", "choices": ["toy dispatcher (EP=1)"]}
    assert report["benchmark"] == ["model.torch_native_dispatcher=toy"]


# ------------------------------------------------------------------------------------------ (5) a benchmark
def toy_benchmark_case(root: Path, overlap: bool, ep: int = 2) -> list[str]:
    """A benchmark case as the guide asks: a harness command line (its logic would live in perf/benchmarks/)."""
    name = f"ep{ep}_overlap_{'on' if overlap else 'off'}"
    return [
        "-mr",
        "qwen3_moe_tiny",
        "-g",
        "h100",
        "-ng",
        "2",
        "-ep",
        str(ep),
        "--max_steps",
        "4",
        f"comm_overlap.overlap_moe_expert_parallel_comm={str(overlap).lower()}",
        "-l",
        str(root / name),
    ]


def test_benchmark_cases_are_built_validated_and_written_by_the_harness(tmp_path):
    paths, _ = write_configs([toy_benchmark_case(tmp_path, overlap) for overlap in (False, True)])
    loaded = [ConfigContainer.from_yaml(path) for path in paths]
    assert [c.comm_overlap.overlap_moe_expert_parallel_comm for c in loaded] == [False, True]
    assert all(c.train.train_iters == 4 for c in loaded)


def test_a_benchmark_case_the_product_refuses_stops_the_benchmark_before_anything_runs(tmp_path):
    with pytest.raises((HarnessError, ConfigError)):
        write_configs([toy_benchmark_case(tmp_path, overlap=True, ep=1)])  # EP overlap needs EP > 1


def _records_its_command(data: Any) -> bool:
    if isinstance(data, list):
        return bool(data) and all(_records_its_command(row) for row in data)
    return isinstance(data, dict) and any(data.get(key) for key in ("command", "commands"))


@pytest.mark.parametrize("path", sorted((ROOT / "docs" / "benchmarks").glob("*_results.json")), ids=lambda p: p.name)
def test_every_published_benchmark_result_records_the_command_that_wrote_it(path):
    assert _records_its_command(json.loads(path.read_text()))


def test_every_benchmark_page_is_listed_by_the_question_it_answers():
    folder = ROOT / "docs" / "benchmarks"
    index = (folder / "README.md").read_text()
    pages = [p.name for p in folder.glob("*.md") if p.name != "README.md"]
    assert pages and [p for p in pages if f"]({p})" not in index] == []


# --------------------------------------------------------------------------------------------- (6) FLOPs
def test_an_attention_listed_as_uncounted_gives_no_flops_figure(monkeypatch, caplog):
    """The guide's first step for a new attention (the existing variants: ``training/test_flops.py``,
    ``test_an_attention_the_formula_does_not_count_gives_no_figure``)."""
    model = qwen3_moe_tiny_pretrain_config().model
    assert flops.flops_per_step(model, 8) > 0
    toy = SimpleNamespace(
        **{f.name: getattr(model, f.name) for f in dataclasses.fields(model)},
        padded_vocab_size=model.padded_vocab_size,
        toy_attention=True,
    )
    assert flops.flops_per_step(toy, 8) == flops.flops_per_step(model, 8)  # not listed: silently counted
    listed = (*flops.UNCOUNTED_ATTENTION, ("toy_attention", "a toy attention"))
    monkeypatch.setattr(flops, "UNCOUNTED_ATTENTION", listed)
    assert flops.flops_per_step(toy, 8) is None
    assert "a toy attention" in caplog.text and "n/a" in caplog.text
