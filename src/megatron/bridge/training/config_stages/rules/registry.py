"""Every rule table of the package, in one registry: what the resolution checks, in the order it
reports them. The validator reads :data:`ALL_RULES`; tests enumerate :data:`RULE_TABLES` (each
table once, every rule id unique)."""

from __future__ import annotations

from megatron.bridge.training.config_stages.rules.cuda_graph_rules import CUDA_GRAPH_RULES
from megatron.bridge.training.config_stages.rules.dispatch_rules import TORCH_NATIVE_DISPATCH_RULES
from megatron.bridge.training.config_stages.rules.emulation_rules import EMULATION_RULES
from megatron.bridge.training.config_stages.rules.kernel_rules import TORCH_NATIVE_KERNEL_RULES
from megatron.bridge.training.config_stages.rules.memory_rules import MEMORY_RULES
from megatron.bridge.training.config_stages.rules.overlap_rules import OVERLAP_RULES
from megatron.bridge.training.config_stages.rules.size_rules import SIZE_RULES
from megatron.bridge.training.config_stages.rules.validation import GENERAL_RULES
from megatron.bridge.training.config_stages.schema.rule_base import Rule
from megatron.bridge.training.config_stages.schema.upstream_sections import UPSTREAM_SECTION_RULES

RULE_TABLES: dict[str, tuple[Rule, ...]] = {
    "overlap": OVERLAP_RULES,
    "general": GENERAL_RULES,
    "cuda-graph": CUDA_GRAPH_RULES,
    "torch-native-dispatch": TORCH_NATIVE_DISPATCH_RULES,
    "torch-native-kernels": TORCH_NATIVE_KERNEL_RULES,
    "upstream-sections": UPSTREAM_SECTION_RULES,
    "memory": MEMORY_RULES,
    "sizes": SIZE_RULES,
    "emulation": EMULATION_RULES,
}
"""Table name -> its rules (``overlap`` and ``general`` are built from smaller tables of their own
modules: the overlap groups, and ranges, precision, run and checkpoint rules)."""

ALL_RULES: tuple[Rule, ...] = tuple(rule for table in RULE_TABLES.values() for rule in table)
"""Every rule, as :func:`megatron.bridge.training.config_stages.resolution.finalize.resolve_config` checks them."""
