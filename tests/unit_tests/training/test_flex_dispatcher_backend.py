"""Flex dispatcher backends: support table, apply/validate on every GPU generation, CPU-host dry runs."""

from __future__ import annotations

import logging

import pytest
from overlap_helpers import ep_overlap_cfg

from megatron.bridge.models.qwen import Qwen3MoEModelProvider
from megatron.bridge.perf.harness.argument_parser import GPU_CHOICES, build_parser
from megatron.bridge.training import flex_dispatcher_backend as fdb
from megatron.bridge.training.config_stages.facts.gpu_catalog import GPU_TYPES, resolve_gpu_target
from megatron.bridge.training.config_stages.resolution import finalize as finalize_module
from megatron.bridge.training.config_stages.rules.registry import ALL_RULES
from megatron.bridge.training.errors import CommOverlapConfigError
from megatron.bridge.training.flex_dispatcher_backend import (
    FLEX_BACKENDS,
    FLEX_RULES,
    FlexDispatcherBackendError,
    apply_flex_dispatcher_backend,
    backend_support,
    validate_flex_dispatcher_backend,
)

# The documented support matrix: DeepEP on Ampere, Hopper, B200/B300; HybridEP on Ampere, Hopper,
# Blackwell including GB200/GB300 NVL72; NCCL EP on Hopper and Blackwell including NVL72.
SUPPORT = {
    "a100": {"deepep": True, "hybridep": True, "ncclep": False},
    "h100": {"deepep": True, "hybridep": True, "ncclep": True},
    "h200": {"deepep": True, "hybridep": True, "ncclep": True},
    "b200": {"deepep": True, "hybridep": True, "ncclep": True},
    "b300": {"deepep": True, "hybridep": True, "ncclep": True},
    "gb200": {"deepep": False, "hybridep": True, "ncclep": True},
    "gb300": {"deepep": False, "hybridep": True, "ncclep": True},
}
PACKAGE_NOTE = {
    "deepep": "flex-deep-ep-not-checked-on-cpu-host",
    "hybridep": "flex-deep-ep-not-checked-on-cpu-host",
    "ncclep": "ncclep-te-nccl-ep-not-checked-on-cpu-host",
}
"""The note a CPU host gets for each backend: its package is checked where the job runs."""
MATRIX = [(gpu, backend, ok) for gpu, row in SUPPORT.items() for backend, ok in row.items()]
FLEX_RULE_IDS = {rule.id for rule in FLEX_RULES}
TE_NCCL_EP = "transformer_engine.pytorch.ep"


@pytest.fixture
def model() -> Qwen3MoEModelProvider:
    m = ep_overlap_cfg().model
    m.moe_shared_expert_overlap = True  # selecting a backend must turn it off
    return m


def _machine(simulate_host, gpu, deep_ep: bool = False, te_nccl_ep: bool = False) -> None:
    """The described host has ``gpu`` (``(capability, name)`` or ``(None, None)``) and the flex
    packages as given (NCCL EP with Transformer Engine)."""
    capability, name = gpu
    simulate_host(
        gpu_capability=capability,
        gpu_name=name,
        gpus=int(capability is not None),
        packages=(("deep_ep",) if deep_ep else ()) + ((TE_NCCL_EP,) if te_nccl_ep else ()),
        transformer_engine="2.20.2" if te_nccl_ep else None,
    )


@pytest.fixture
def cpu_host(simulate_host):
    """No visible GPU, no deep_ep and no Transformer Engine NCCL EP."""
    _machine(simulate_host, (None, None))


@pytest.fixture
def gpu_host(simulate_host):
    """A visible H200 without deep_ep and without Transformer Engine NCCL EP."""
    _machine(simulate_host, ((9, 0), "NVIDIA H200"))


def test_gpu_table_covers_every_generation() -> None:
    assert set(GPU_TYPES) == set(SUPPORT)
    assert GPU_TYPES["h100"].capability == (9, 0) and GPU_TYPES["b200"].capability == (10, 0)
    assert GPU_TYPES["gb200"].capability == (10, 0) and GPU_TYPES["gb200"].nvl72
    assert GPU_TYPES["b300"].capability == (10, 3) and not GPU_TYPES["b300"].nvl72
    assert GPU_TYPES["a100"].capability == (8, 0)


@pytest.mark.parametrize("gpu, backend, ok", MATRIX)
def test_support_matrix(gpu: str, backend: str, ok: bool) -> None:
    supported, reason = backend_support(backend, resolve_gpu_target(device_name=gpu))
    assert supported is ok, reason


@pytest.mark.parametrize("gpu, backend, ok", MATRIX)
def test_apply_on_every_gpu(gpu: str, backend: str, ok: bool, model, cpu_host) -> None:
    if ok:
        assert apply_flex_dispatcher_backend(model, backend, device_name=gpu) == backend
        assert model.moe_token_dispatcher_type == "flex"
        assert model.moe_flex_dispatcher_backend == backend
        assert model.moe_shared_expert_overlap is False
    else:
        with pytest.raises(FlexDispatcherBackendError) as info:
            apply_flex_dispatcher_backend(model, backend, device_name=gpu)
        assert isinstance(info.value, CommOverlapConfigError)
        assert model.moe_token_dispatcher_type == "alltoall"  # untouched


@pytest.mark.parametrize("gpu, backend, ok", MATRIX)
def test_validate_on_every_gpu(gpu: str, backend: str, ok: bool, model, cpu_host) -> None:
    model.moe_token_dispatcher_type = "flex"
    model.moe_flex_dispatcher_backend = backend
    if ok:
        notes = validate_flex_dispatcher_backend(model, device_name=gpu)
        assert [n.rule for n in notes] == [PACKAGE_NOTE[backend]]
    else:
        with pytest.raises(FlexDispatcherBackendError) as info:
            validate_flex_dispatcher_backend(model, device_name=gpu)
        assert [v.rule for v in info.value.violations] == ["flex-backend-supported-on-gpu"]


@pytest.mark.parametrize("gpu", ["gb200", "gb300"])
def test_explicit_fallback_is_logged(gpu: str, model, cpu_host, caplog) -> None:
    model.moe_flex_dispatcher_backend = None
    with caplog.at_level(logging.WARNING):
        assert apply_flex_dispatcher_backend(model, "deepep", device_name=gpu, fallback="alltoall") is None
    assert model.moe_token_dispatcher_type == "alltoall" and model.moe_flex_dispatcher_backend is None
    assert "falling back to plain alltoall" in caplog.text


def test_fallback_not_used_when_supported(model, cpu_host) -> None:
    assert apply_flex_dispatcher_backend(model, "deepep", device_name="h100", fallback="alltoall") == "deepep"


def test_bad_fallback_and_unknown_backend(model) -> None:
    with pytest.raises(ValueError):
        apply_flex_dispatcher_backend(model, "deepep", device_name="h100", fallback="allgather")  # type: ignore[arg-type]
    with pytest.raises(FlexDispatcherBackendError):
        apply_flex_dispatcher_backend(model, "None", device_name="h100")


def test_none_means_plain_alltoall(model) -> None:
    model.moe_token_dispatcher_type = "flex"
    model.moe_flex_dispatcher_backend = "deepep"
    assert apply_flex_dispatcher_backend(model, None) is None
    assert model.moe_token_dispatcher_type == "alltoall" and model.moe_flex_dispatcher_backend is None


@pytest.mark.parametrize(
    "capability, name, expected",
    [
        ((9, 0), "NVIDIA H100 80GB HBM3", ((9, 0), "h100", False)),
        ((10, 0), "NVIDIA GB200", ((10, 0), "gb200", True)),
        ((10, 0), "NVIDIA B200", ((10, 0), "b200", False)),
        ((10, 3), "NVIDIA GB300", ((10, 3), "gb300", True)),
        ((10, 0), None, ((10, 0), None, None)),
        (None, "gb200", ((10, 0), "gb200", True)),
    ],
)
def test_resolve_gpu_target(capability, name, expected) -> None:
    target = resolve_gpu_target(capability, name)
    assert (target.capability, target.name, target.nvl72) == expected
    assert target.source == "argument"


def test_capability_without_system_name_cannot_decide_deepep(model, cpu_host, caplog) -> None:
    """Blackwell (10, 0) could be a B200 board or a GB200 NVL72 system: say so, do not guess."""
    supported, reason = backend_support("deepep", resolve_gpu_target((10, 0)))
    assert supported is None and "GB200" in reason
    with caplog.at_level(logging.WARNING):
        assert apply_flex_dispatcher_backend(model, "deepep", device_capability=(10, 0)) == "deepep"
    assert "[flex-backend-gpu-not-checked]" in caplog.text and "NVL72 system is unknown" in caplog.text


def test_target_from_visible_gpu(gpu_host) -> None:
    target = resolve_gpu_target()
    assert target.capability == (9, 0) and target.name == "h200" and target.source == "visible GPU"


def test_arguments_beat_visible_gpu(gpu_host) -> None:
    assert resolve_gpu_target(device_name="gb200").name == "gb200"


def test_unknown_target_on_cpu_host(model, cpu_host) -> None:
    target = resolve_gpu_target()
    assert not target.known and "unknown" in target.describe()
    model.moe_token_dispatcher_type = "flex"
    model.moe_flex_dispatcher_backend = "deepep"
    notes = validate_flex_dispatcher_backend(model)
    assert {n.rule for n in notes} == {"flex-backend-gpu-not-checked", "flex-deep-ep-not-checked-on-cpu-host"}
    assert all(n.severity == "warning" for n in notes)


def test_missing_deep_ep_on_gpu_host_fails_with_install_hint(model, gpu_host) -> None:
    model.moe_token_dispatcher_type = "flex"
    model.moe_flex_dispatcher_backend = "hybridep"
    with pytest.raises(FlexDispatcherBackendError) as info:
        validate_flex_dispatcher_backend(model)
    (violation,) = info.value.violations
    assert violation.rule == "flex-needs-deep-ep" and "DeepEP" in violation.fix


def test_deep_ep_present_on_gpu_host(model, simulate_host) -> None:
    _machine(simulate_host, ((9, 0), "NVIDIA H100"), deep_ep=True)
    model.moe_token_dispatcher_type = "flex"
    model.moe_flex_dispatcher_backend = "deepep"
    assert validate_flex_dispatcher_backend(model) == []


def test_backend_without_flex_dispatcher_is_reported(model, cpu_host) -> None:
    """A backend alone does not activate flex dispatch: it would silently do nothing, so it is refused."""
    model.moe_flex_dispatcher_backend = "deepep"
    with pytest.raises(FlexDispatcherBackendError) as info:
        validate_flex_dispatcher_backend(model, device_name="h100")
    assert info.value.violations[0].rule == "flex-backend-needs-flex-dispatcher"


def test_plain_alltoall_validates_cleanly(model, cpu_host) -> None:
    assert validate_flex_dispatcher_backend(model, device_name="gb200") == []


# cfg.validate() reaches the same rules through RuleContext (target GPU from cfg.dist.target_gpu).


@pytest.mark.parametrize("gpu, backend, ok", MATRIX)
def test_cfg_validate_checks_target_gpu(gpu: str, backend: str, ok: bool, cpu_host) -> None:
    cfg = ep_overlap_cfg()
    cfg.dist.target_gpu = gpu
    cfg.model.moe_token_dispatcher_type = "flex"
    cfg.model.moe_flex_dispatcher_backend = backend
    if backend == "ncclep":
        cfg.model.moe_expert_rank_capacity_factor = 1.5  # megatron-core 0.19.2's NCCL EP needs its budget
    if ok:
        assert cfg.validate(world_size=2).model.moe_flex_dispatcher_backend == backend
    else:
        with pytest.raises(CommOverlapConfigError) as info:
            cfg.validate(world_size=2)
        assert "model.moe_flex_dispatcher_backend" in info.value.fields


@pytest.mark.parametrize("dispatcher", ["flex", "alltoall"])
@pytest.mark.parametrize("gpu, backend, ok", MATRIX)
def test_the_helper_and_cfg_validate_report_the_same_flex_problems(gpu, backend, ok, dispatcher, cpu_host) -> None:
    """One path: the upstream helper checks the registry's flex rules, which cfg.validate() checks."""
    cfg = ep_overlap_cfg()
    cfg.dist.target_gpu = gpu
    cfg.model.moe_token_dispatcher_type = dispatcher
    cfg.model.moe_flex_dispatcher_backend = backend
    resolution = finalize_module.resolve_config(cfg, world_size=2)
    from_validate = [v for v in resolution.errors + resolution.warnings if v.rule in FLEX_RULE_IDS]
    from_helper = fdb.flex_dispatcher_violations(cfg.model, resolve_gpu_target(device_name=gpu))
    assert [(v.rule, v.values) for v in from_helper] == [(v.rule, v.values) for v in from_validate]
    assert any(v.severity == "error" for v in from_helper) is not (ok and dispatcher == "flex")


def test_the_helpers_check_the_registrys_flex_rules() -> None:
    assert fdb.FLEX_DISPATCHER_RULES == tuple(r for r in ALL_RULES if r.group == "flex-dispatcher")
    assert {r.id for r in fdb.FLEX_DISPATCHER_RULES} == FLEX_RULE_IDS


def test_cfg_validate_dry_run_without_target(cpu_host, caplog) -> None:
    cfg = ep_overlap_cfg()
    cfg.model.moe_token_dispatcher_type = "flex"
    cfg.model.moe_flex_dispatcher_backend = "deepep"
    with caplog.at_level(logging.WARNING):
        cfg.validate(world_size=2)
    assert "flex-backend-gpu-not-checked" in caplog.text
    assert "flex-deep-ep-not-checked-on-cpu-host" in caplog.text


def test_cfg_validate_on_gpu_host_without_deep_ep(gpu_host) -> None:
    cfg = ep_overlap_cfg()
    cfg.model.moe_token_dispatcher_type = "flex"
    cfg.model.moe_flex_dispatcher_backend = "deepep"
    with pytest.raises(CommOverlapConfigError) as info:
        cfg.validate(world_size=2)
    assert [v.rule for v in info.value.violations] == ["flex-needs-deep-ep"]


def test_support_table_in_docs() -> None:
    table = fdb.render_support_table()
    assert "| `gb200` | 10.0 | Blackwell | yes | no | yes |" in table


def test_one_table_feeds_backend_names_rules_and_flag_choices() -> None:
    """Backend names come from the support table only: the model field, the flag and the rules."""
    from typing import get_args, get_type_hints

    from megatron.bridge.models.gpt_provider import GPTModelProvider

    field_type = get_type_hints(GPTModelProvider)["moe_flex_dispatcher_backend"]
    assert set(get_args(get_args(field_type)[0])) == set(FLEX_BACKENDS) == set(fdb.FLEX_BACKEND_SUPPORT)
    assert set(GPU_CHOICES) == set(GPU_TYPES) | {"cpu"}
    flag = next(a for a in build_parser()._actions if a.dest == "moe_flex_dispatcher_backend")
    assert all(name in flag.help for name in FLEX_BACKENDS)
    supported_rule = next(r for r in FLEX_RULES if r.id == "flex-backend-supported-on-gpu")
    assert all(b.supported in supported_rule.message for b in fdb.FLEX_BACKEND_SUPPORT.values())


@pytest.mark.parametrize("gpu", ["gb200", "gb300"])
def test_selection_and_validation_refuse_with_one_rule_and_one_message(gpu, model, cpu_host) -> None:
    """``apply_flex_dispatcher_backend`` and ``cfg.validate()`` give the same violation, whose fix
    speaks of settings (no Python keyword argument)."""
    with pytest.raises(FlexDispatcherBackendError) as applied:
        apply_flex_dispatcher_backend(model, "deepep", device_name=gpu)
    cfg = ep_overlap_cfg()
    cfg.dist.target_gpu = gpu
    cfg.model.moe_token_dispatcher_type, cfg.model.moe_flex_dispatcher_backend = "flex", "deepep"
    with pytest.raises(CommOverlapConfigError) as validated:
        cfg.validate(world_size=2)
    (a,), (v,) = applied.value.violations, validated.value.violations
    assert (
        (a.rule, a.message, a.fix) == (v.rule, v.message, v.fix) == ("flex-backend-supported-on-gpu", v.message, v.fix)
    )
    assert "fallback" not in v.fix and "--moe_flex_dispatcher_backend None" in v.fix
