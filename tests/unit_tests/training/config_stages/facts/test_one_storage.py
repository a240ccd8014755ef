"""Each setting has one storage, its owner: what a user's container holds after ``validate()``.

The megatron-facing copies (``model.delay_wgrad_compute``, ``ddp.overlap_grad_reduce``, the precision
flags) are written on the resolved configuration and, so that a user reads what the run uses, on the
user's container too; nothing hidden is added to it, a saved YAML holds the owners only, and the
container is resolved once per process.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import yaml
from container_facts import attributes_beyond_fields, container_extras, copies_in_saved_yaml, decided_copies

from megatron.bridge.recipes.qwen import qwen3_30b_a3b_pretrain_config, qwen3_moe_tiny_pretrain_config
from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.config_stages.schema.rule_base import read_field
from megatron.bridge.training.errors import CommOverlapConfigError
from megatron.bridge.training.utils.omegaconf_utils import apply_overrides


@pytest.fixture
def ep_cfg() -> ConfigContainer:
    cfg = qwen3_30b_a3b_pretrain_config()
    cfg.comm_overlap.overlap_moe_expert_parallel_comm = True
    cfg.comm_overlap.delay_wgrad_compute = True
    return cfg


def test_validate_adds_nothing_but_the_copies_effective_values(ep_cfg) -> None:
    before = attributes_beyond_fields(ep_cfg)
    resolution = ep_cfg.resolve(world_size=16)
    assert container_extras(ep_cfg) == set()
    assert attributes_beyond_fields(ep_cfg) == before  # megatron-core's own and the section aliases
    decided = decided_copies(ep_cfg)
    assert len(decided) > 10
    for owned in decided:
        assert read_field(ep_cfg, owned.target) == read_field(resolution.effective, owned.target), owned.target
        if owned.owner.startswith("comm_overlap."):
            assert read_field(ep_cfg, owned.target) == read_field(resolution.effective, owned.owner), owned.target
    assert ep_cfg.comm_overlap.overlap_grad_reduce is None  # the owner stays as written
    assert ep_cfg.ddp.overlap_grad_reduce is True and ep_cfg.model.delay_wgrad_compute is True


def test_saved_yaml_of_a_validated_container_holds_owners_only(ep_cfg) -> None:
    ep_cfg.validate(world_size=16)
    assert copies_in_saved_yaml(ep_cfg) == []
    assert yaml.safe_load(ep_cfg.to_yaml())["comm_overlap"]["delay_wgrad_compute"] is True


def test_a_container_is_resolved_once_until_it_changes(ep_cfg, resolution_counter) -> None:
    first = ep_cfg.resolve(world_size=16)
    again = ep_cfg.resolve(world_size=16)
    assert len(resolution_counter) == 1
    assert again.report is first.report and again.config is not first.config  # a fresh config to train
    for owned in decided_copies(ep_cfg):
        assert read_field(again.config, owned.target) == read_field(first.config, owned.target)
    ep_cfg.train.global_batch_size *= 2
    ep_cfg.resolve(world_size=16)
    ep_cfg.resolve(world_size=32)
    assert len(resolution_counter) == 3


@pytest.mark.parametrize(
    "rebuild",
    [
        lambda cfg: apply_overrides(cfg, ["comm_overlap.delay_wgrad_compute=false"]),
        lambda cfg: dataclasses.replace(
            cfg, comm_overlap=dataclasses.replace(cfg.comm_overlap, delay_wgrad_compute=False)
        ),
        lambda cfg: _owner_changed(copy.deepcopy(cfg)),
    ],
    ids=["override", "dataclasses-replace", "deepcopy"],
)
def test_a_rebuilt_container_knows_which_copies_resolution_wrote(ep_cfg, rebuild) -> None:
    """A copy written by one validate() is not a user's direct write in a container rebuilt from it:
    the owner changed there moves the copy, with nothing carried by hand."""
    ep_cfg.validate(world_size=16)
    assert ep_cfg.model.delay_wgrad_compute is True
    rebuilt = rebuild(ep_cfg)
    assert rebuilt.validate(world_size=16).model.delay_wgrad_compute is False
    assert rebuilt.model.delay_wgrad_compute is False and rebuilt.ddp.delay_wgrad_compute is False


def _owner_changed(cfg: ConfigContainer) -> ConfigContainer:
    cfg.comm_overlap.delay_wgrad_compute = False
    return cfg


def test_a_direct_write_after_validate_is_still_refused(ep_cfg) -> None:
    ep_cfg.validate(world_size=16)
    ep_cfg.ddp.delay_wgrad_compute = False
    with pytest.raises(CommOverlapConfigError, match="owned-field-set-directly"):
        ep_cfg.validate(world_size=16)


def test_a_fresh_section_holds_the_users_values() -> None:
    """A section assigned after validate() has no record: its values are the user's, checked as such."""
    cfg = qwen3_moe_tiny_pretrain_config()
    cfg.validate()
    cfg.ddp = type(cfg.ddp)(overlap_grad_reduce=True)
    with pytest.raises(CommOverlapConfigError, match="owned-field-set-directly"):
        cfg.validate()
