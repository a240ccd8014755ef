"""Child program: what a rank knows of the model providers before it reads its config.

Imports only the module the launchers start on every rank (``megatron.bridge.training.entry``) and
prints ``REPORT {json}``: the provider classes a config file's ``model._target_`` may name there, and
the providers ``megatron.bridge.models`` re-exports. A family re-exported from
``megatron.bridge.models`` must be among the former, or the ranks refuse a config that uses it.
"""

import json

import megatron.bridge.models as models
import megatron.bridge.training.entry  # noqa: F401  (what a rank imports first)
from megatron.bridge.models.gpt_provider import GPTModelProvider
from megatron.bridge.training.config_stages.reading.overrides import allowed_targets

exported = [
    f"{cls.__module__}.{cls.__qualname__}"
    for name in models.__all__
    if isinstance(cls := getattr(models, name), type) and issubclass(cls, GPTModelProvider)
]
print("REPORT " + json.dumps({"allowed": sorted(allowed_targets(GPTModelProvider)), "exported": sorted(exported)}))
