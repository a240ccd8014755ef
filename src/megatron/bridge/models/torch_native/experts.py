"""Routed experts as grouped GEMMs (``TorchGroupedMLP``), a drop-in for ``SequentialMLP``.

megatron-core's ``MoELayer`` calls ``experts(dispatched_input, tokens_per_expert, permuted_probs)``
with tokens already sorted by local expert. Instead of a Python loop over per-expert ``MLP``s this
module keeps the local experts' weights stacked:

* ``weight1``: ``[E_local, (2 if GLU) * ffn / etp, hidden]`` (fc1, gate rows then linear rows, as
  megatron's ``ColumnParallelLinear`` GLU layout);
* ``weight2``: ``[E_local, hidden, ffn / etp]`` (fc2).

Checkpoint compatibility with the plain spec:

* ``sharded_state_dict`` emits, per local expert, exactly the keys, shapes, global offsets,
  SwiGLU factories and replica ids that ``SequentialMLP`` emits
  (``...experts.linear_fc1.weight`` sharded over the global expert axis, ``_extra_state`` objects),
  so distributed checkpoints load across the two specs;
* ``load_state_dict`` also accepts the plain spec's local keys
  (``local_experts.<i>.linear_fc{1,2}.weight``) and stacks them, which is what a distributed
  checkpoint load hands back, and what copying weights from a plain-spec model needs.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterable

import torch
from megatron.core import tensor_parallel
from megatron.core.dist_checkpointing.utils import replace_prefix_for_sharding
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel.random import get_expert_parallel_rng_tracker_name
from megatron.core.transformer.mlp import MLPSubmodules, apply_swiglu_sharded_factory
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.utils import (
    ensure_metadata_has_dp_cp_group,
    make_sharded_tensors_for_checkpoint,
)

from megatron.bridge.models.torch_native import bounded_swiglu
from megatron.bridge.models.torch_native.compiled import LazyCompiled
from megatron.bridge.models.torch_native.grouped_gemm import WgradStash, fuses_into_main_grad, grouped_linear

logger = logging.getLogger(__name__)
_PLAIN_KEY = re.compile(r"^local_experts\.(\d+)\.linear_fc([12])\.(weight|_extra_state)$")


def _param_device(config: TransformerConfig) -> torch.device:
    if config.use_cpu_initialization or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _swiglu_probs(h: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * linear * prob`` computed in fp32, stored in ``h``'s dtype (megatron's order)."""
    gate, linear = torch.chunk(h, 2, dim=-1)
    act = torch.nn.functional.silu(gate) * linear
    return (act * probs.unsqueeze(-1)).to(h.dtype)


# dynamic: the number of routed tokens changes every micro-batch
_COMPILED_SWIGLU = LazyCompiled(_swiglu_probs, "experts SwiGLU", dynamic=True)


def _plain_swiglu(config: TransformerConfig) -> bool:
    """Qwen3's activation: SwiGLU without clamp or offset (the fused kernels compute only that)."""
    return (
        config.gated_linear_unit
        and config.activation_func is torch.nn.functional.silu
        and getattr(config, "activation_func_clamp_value", None) is None
        and not getattr(config, "glu_linear_offset", 0.0)
    )


def _compiled_swiglu_usable(config: TransformerConfig) -> bool:
    """Only the plain SwiGLU (Qwen3) is compiled; other activations take the eager path."""
    return _COMPILED_SWIGLU.enabled and _plain_swiglu(config)


class _BoundedKernel:
    """:func:`bounded_swiglu_probs` while it works; after a first failure (a Triton that cannot
    build it on this GPU) a warning, then ``None`` so the caller takes the whole-buffer path."""

    def __init__(self) -> None:
        self.failed = False

    def usable(self, config: TransformerConfig) -> bool:
        return not self.failed and bounded_swiglu.available() and _plain_swiglu(config)

    def __call__(self, h: torch.Tensor, probs: torch.Tensor, count: torch.Tensor) -> torch.Tensor | None:
        try:
            return bounded_swiglu.bounded_swiglu_probs(h, probs, count)
        except torch.OutOfMemoryError:
            raise  # the GPU is full: no other path would fit either
        except Exception as exc:  # a kernel that cannot build must not stop training
            self.failed = True
            logger.warning(
                "torch_native experts: the bounded SwiGLU kernel failed (%s); "
                "the activation runs over the whole padded buffer",
                exc,
            )
            return None


_BOUNDED_SWIGLU = _BoundedKernel()


class TorchGroupedMLP(MegatronModule):
    """SwiGLU (or plain activation) experts computed with two grouped GEMMs.

    ``delay_wgrad_compute=True`` on the config defers both weight-gradient GEMMs to
    :meth:`backward_dw`, which megatron-core's EP-overlap schedule calls; DDP's per-parameter
    hooks then fire from there (``register_wgrad_accumulation_and_reduce_hooks``).
    """

    def __init__(
        self,
        num_local_experts: int,
        config: TransformerConfig,
        submodules: MLPSubmodules | None = None,
        pg_collection: ProcessGroupCollection | None = None,
        name: str | None = None,
    ):
        super().__init__(config=config)
        if config.add_bias_linear:
            raise NotImplementedError(
                "torch_native experts are bias-free; set add_bias_linear=False (Qwen3 has no bias) "
                "or use layer_spec='local'."
            )
        if config.fp8 or getattr(config, "fp4", None):
            raise NotImplementedError("torch_native experts run in bf16/fp16/fp32, not fp8/fp4")
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups()
        self.num_local_experts = num_local_experts
        self.ep_group = pg_collection.ep
        self.tp_group = pg_collection.expt_tp
        self.dp_group = pg_collection.expt_dp
        etp = self.tp_group.size() if self.tp_group is not None else 1
        ffn = config.moe_ffn_hidden_size
        if ffn % etp:
            raise ValueError(f"moe_ffn_hidden_size={ffn} is not divisible by expert TP size {etp}")
        self.ffn_per_partition = ffn // etp
        fc1_rows = self.ffn_per_partition * (2 if config.gated_linear_unit else 1)
        device = _param_device(config)
        dtype = config.params_dtype
        self.weight1 = torch.nn.Parameter(
            torch.empty(num_local_experts, fc1_rows, config.hidden_size, device=device, dtype=dtype)
        )
        self.weight2 = torch.nn.Parameter(
            torch.empty(num_local_experts, config.hidden_size, self.ffn_per_partition, device=device, dtype=dtype)
        )
        self._init_weights()
        # As megatron's expert linears: reduced over the expert-data-parallel group (allreduce=False)
        # when experts are sharded differently from dense layers, else over the full DP group.
        use_expert_pgs = config.expert_model_parallel_size > 1 or (
            config.expert_tensor_parallel_size != config.tensor_model_parallel_size
        )
        for param, partition_dim in ((self.weight1, 1), (self.weight2, 2)):
            param.allreduce = not use_expert_pgs
            tensor_parallel.set_tensor_model_parallel_attributes(param, True, partition_dim, 1)
            param.skip_backward_post_hook = bool(config.delay_wgrad_compute)
        self.padded_rows = False
        """Set by the MoE layer whose dispatcher hands over a worst-case buffer (rows past
        ``tokens_per_expert.sum()`` are padding): the activation then skips those rows."""
        self.stashes = {"weight1": WgradStash(), "weight2": WgradStash()}
        self._wgrad_hooks: list[Callable[[], None]] = []
        self.set_delay_wgrad_compute(bool(config.delay_wgrad_compute))
        self._register_load_state_dict_pre_hook(self._stack_plain_spec_keys, with_module=True)

    # ------------------------------------------------------------------ init / state

    def _init_weights(self) -> None:
        """Per-expert init from the config's init methods on the expert-parallel RNG stream."""
        if not self.config.perform_initialization:
            return
        if self.config.use_cpu_initialization or not self.weight1.is_cuda:
            rng = contextlib.nullcontext()  # plain torch RNG, as megatron's CPU initialisation
        else:
            rng = tensor_parallel.get_cuda_rng_tracker().fork(get_expert_parallel_rng_tracker_name())
        with torch.no_grad(), rng:
            for e in range(self.num_local_experts):
                self.config.init_method(self.weight1[e])
                self.config.output_layer_init_method(self.weight2[e])

    @staticmethod
    def _stack_plain_spec_keys(module, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        """Accept ``SequentialMLP``'s per-expert keys by stacking them into ``weight1``/``weight2``."""
        found = {}
        for key in [k for k in state_dict if k.startswith(prefix)]:
            match = _PLAIN_KEY.match(key[len(prefix) :])
            if match is None:
                continue
            value = state_dict.pop(key)
            if match.group(3) == "weight":
                found.setdefault(match.group(2), {})[int(match.group(1))] = value
        for fc, per_expert in found.items():
            name = f"weight{fc}"
            if sorted(per_expert) != list(range(module.num_local_experts)):
                errors.append(
                    f"{prefix}local_experts.*.linear_fc{fc}.weight: expected experts "
                    f"0..{module.num_local_experts - 1}, got {sorted(per_expert)}"
                )
                continue
            state_dict[f"{prefix}{name}"] = torch.stack([per_expert[e] for e in range(module.num_local_experts)])

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """Same sharded keys/offsets/replica ids as ``SequentialMLP`` (see module docstring)."""
        metadata = ensure_metadata_has_dp_cp_group(metadata)
        singleton = (metadata or {}).get("singleton_local_shards", False)
        num_global = self.ep_group.size() * self.num_local_experts
        first_global = self.ep_group.rank() * self.num_local_experts
        out = {}
        for e in range(self.num_local_experts):
            g = first_global + e
            local_prefix = f"{prefix}local_experts.{e}."
            if singleton:
                sharded_prefix, offsets = f"{prefix}experts.{g}.", sharded_offsets
            else:
                sharded_prefix = f"{prefix}experts."
                offsets = (*sharded_offsets, (len(sharded_offsets), g, num_global))
            expert_sd = {}
            for fc, weight, tp_axis in (("linear_fc1", self.weight1, 0), ("linear_fc2", self.weight2, 1)):
                sub = make_sharded_tensors_for_checkpoint(
                    {"weight": weight.detach()[e], "_extra_state": None},
                    f"{local_prefix}{fc}.",
                    {"weight": tp_axis},
                    offsets,
                    tp_group=self.tp_group,
                    dp_cp_group=metadata["dp_cp_group"],
                )
                key = f"{local_prefix}{fc}.weight"
                if fc == "linear_fc1" and self.config.gated_linear_unit:
                    sub[key] = apply_swiglu_sharded_factory(
                        sub[key], offsets, singleton, tp_group=self.tp_group, dp_group=metadata["dp_cp_group"]
                    )
                expert_sd.update(sub)
            replace_prefix_for_sharding(expert_sd, local_prefix, sharded_prefix)
            for sh in expert_sd.values():
                sh.replica_id = (*sh.replica_id[:2], self.dp_group.rank())
            out.update(expert_sd)
        return out

    # ------------------------------------------------------------------ forward

    def _activation(self, h: torch.Tensor, probs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """GLU/activation then routing-prob scaling; one fused kernel on CUDA where possible, over the
        real rows only when the buffer is padded (the count stays on the GPU)."""
        if h.is_cuda and self.padded_rows and _BOUNDED_SWIGLU.usable(self.config):
            out = _BOUNDED_SWIGLU(h, probs, counts.sum())
            if out is not None:
                return out
        if h.is_cuda and _compiled_swiglu_usable(self.config):
            return _COMPILED_SWIGLU(self._activation_eager, h, probs)
        return self._activation_eager(h, probs)

    def _activation_eager(self, h: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """GLU/activation then routing-prob scaling, with megatron MLP's dtype behaviour."""
        cfg = self.config
        if cfg.gated_linear_unit:
            gate, linear = torch.chunk(h, 2, dim=-1)
            clamp = getattr(cfg, "activation_func_clamp_value", None)
            if clamp is not None:
                gate = gate.clamp(min=None, max=clamp)
                linear = linear.clamp(min=-clamp, max=clamp)
            act = cfg.activation_func(gate) * (linear + getattr(cfg, "glu_linear_offset", 0.0))
        else:
            act = cfg.activation_func(h)
        return (act * probs.unsqueeze(-1)).to(act.dtype)

    def forward(self, hidden: torch.Tensor, tokens_per_expert: torch.Tensor, permuted_probs: torch.Tensor, **_):
        """``[T, hidden]`` tokens sorted by local expert -> ``([T, hidden], None)``."""
        if self.config.moe_apply_probs_on_input:
            if self.config.moe_router_topk != 1:
                raise ValueError("moe_apply_probs_on_input needs moe_router_topk == 1")
            hidden = (permuted_probs.unsqueeze(-1) * hidden).to(hidden.dtype)
            permuted_probs = torch.ones_like(permuted_probs)
        counts = tokens_per_expert
        if hidden.is_cuda and counts.device != hidden.device:
            counts = counts.to(hidden.device, non_blocking=True)
        stash1 = self.stashes["weight1"] if self._delay_wgrad else None
        stash2 = self.stashes["weight2"] if self._delay_wgrad else None
        # A plain TransformerConfig (modules built without the provider) has no such field.
        backend = getattr(self.config, "torch_native_grouped_gemm_backend", "auto")
        accumulation = getattr(self.config, "torch_native_wgrad_accumulation", "auto")
        h = grouped_linear(hidden, self.weight1, counts, backend, stash1, accumulation)
        h = self._activation(h, permuted_probs, counts)
        out = grouped_linear(h, self.weight2, counts, backend, stash2, accumulation)
        return out, None

    # ------------------------------------------------------------------ delayed wgrad

    def set_delay_wgrad_compute(self, enabled: bool) -> None:
        """Turn the deferred weight-gradient mode on or off (tests and the schedule use this)."""
        self._delay_wgrad = enabled
        for stash in self.stashes.values():
            stash.enabled = enabled
            if not enabled:
                stash.clear()

    def register_wgrad_accumulation_and_reduce_hooks(self, hook: Callable[[], None]) -> None:
        """DDP hands one hook per parameter here when the parameter skips autograd's hook."""
        self._wgrad_hooks.append(hook)

    def backward_dw(self) -> None:
        """Run the deferred fc2 then fc1 weight-gradient GEMMs and fire DDP's grad hooks."""
        if not self._delay_wgrad:
            return
        ran = self.stashes["weight2"].compute(self.weight2)
        ran = self.stashes["weight1"].compute(self.weight1) or ran
        if ran:
            for hook in self._wgrad_hooks:
                hook()


def expert_wgrad_accumulation(model_chunks: Iterable[torch.nn.Module]) -> dict[str, str] | None:
    """Which weight-gradient accumulation the grouped experts of these (DDP-wrapped) chunks use.

    Read from the built parameters (their ``main_grad``), so the start-up line and ``summary.json``
    say what runs, not only what was asked for. ``None`` when there are no torch-native experts.
    """
    experts = next((m for chunk in model_chunks for m in chunk.modules() if isinstance(m, TorchGroupedMLP)), None)
    if experts is None:
        return None
    setting = getattr(experts.config, "torch_native_wgrad_accumulation", "auto")
    main_grad = getattr(experts.weight1, "main_grad", None)
    fused = fuses_into_main_grad(experts.weight1, setting)
    if fused:
        how = "fused: a Triton grouped GEMM adds into the fp32 main_grad"
    elif main_grad is None:
        how = "unfused: no DDP main_grad"
    else:
        how = (
            f"unfused: bf16 gradient added by DDP's hook into a {str(main_grad.dtype).replace('torch.', '')} main_grad"
        )
    return {
        "setting": setting,
        "path": "fused" if fused else "unfused",
        "description": f"expert weight gradients {how} (torch_native_wgrad_accumulation={setting!r})",
    }
