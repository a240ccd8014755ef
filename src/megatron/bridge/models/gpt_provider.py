"""``GPTModelProvider``: a megatron-core ``TransformerConfig`` that also knows how to build a ``GPTModel``.

megatron-core's ``TransformerConfig.__post_init__`` derives fields and re-checks rules the moment
the object is created. Recipes and overrides must be able to mutate the config first, so this
provider defers ``__post_init__`` until :meth:`GPTModelProvider.finalize`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

from megatron.core import parallel_state
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron.bridge.models import grad_accumulation_fusion
from megatron.bridge.models.comm_stream_grads import keep_comm_stream_grads_for_accumulation
from megatron.bridge.models.dispatch.megatron_alltoall import ChunkSort
from megatron.bridge.models.dispatch.path_registry import FLEX_BACKENDS, TORCH_NATIVE_DISPATCHERS
from megatron.bridge.models.dispatch.sorted_dispatch import TorchNativeEPTransport
from megatron.bridge.models.grad_accumulation_fusion import provide_missing_kernel
from megatron.bridge.models.layer_specs import LayerSpecName, build_decoder_block_spec, choose_for_model
from megatron.bridge.models.torch_native import linear
from megatron.bridge.models.torch_native.backends import (
    CrossEntropyBackend,
    GroupedGemmBackend,
    WgradAccumulation,
)
from megatron.bridge.models.torch_native.compiled import set_compile_enabled
from megatron.bridge.models.torch_native.cross_entropy import select_backend
from megatron.bridge.utils.strict_fields import StrictFields

if TYPE_CHECKING:
    from megatron.core.models.gpt import GPTModel

logger = logging.getLogger(__name__)

CrossEntropyImpl = Literal["native", "te", "torch_native"]
CROSS_ENTROPY_IMPLS = get_args(CrossEntropyImpl)
TorchNativeDispatcher = Literal[TORCH_NATIVE_DISPATCHERS]  # type: ignore[valid-type]
"""``auto`` and the torch-native dispatch paths' values (``models/dispatch/path_registry.py``)."""
FlexBackend = Literal[FLEX_BACKENDS]  # type: ignore[valid-type]
"""The flex dispatch paths' names (``models/dispatch/path_registry.py``)."""


def padded_vocab_size(vocab_size: int, divisible_by: int, tensor_parallel_size: int) -> int:
    """Round the vocabulary up so each tensor-parallel shard has a multiple of ``divisible_by`` rows."""
    multiple = divisible_by * tensor_parallel_size
    return ((vocab_size + multiple - 1) // multiple) * multiple


@dataclass
class GPTModelProvider(StrictFields, TransformerConfig):
    """GPT model settings plus ``provide()``; ``finalize()`` runs megatron-core's deferred checks."""

    seq_length: int = 1024
    vocab_size: int | None = None
    make_vocab_size_divisible_by: int = 128
    share_embeddings_and_output_weights: bool = False
    position_embedding_type: Literal["learned_absolute", "rope", "none"] = "rope"
    rotary_base: float = 10000.0
    rotary_percent: float = 1.0
    fp16_lm_cross_entropy: bool = False
    parallel_output: bool = True
    layer_spec: LayerSpecName = "auto"
    """Layer implementation: ``transformer_engine``, ``local`` (plain megatron-core), ``torch_native``
    (SDPA attention, grouped-GEMM experts, compiled RMSNorm), or ``auto``: the run's resolution picks
    one (``layer_specs.choose_layer_spec``: torch-native unless a feature needs Transformer Engine)
    and the finalized config holds the choice."""
    moe_flex_dispatcher_backend: FlexBackend | None = None
    """Flex dispatcher backend; only meaningful with ``moe_token_dispatcher_type="flex"``.
    ``None`` (unlike megatron-core's ``"deepep"`` default) so that an unset backend is visible. The
    flex paths of the dispatch registry (``models/dispatch/``), each with its GPU-support table."""
    moe_chunk_sort: ChunkSort = "megatron"
    """How megatron-core's alltoall dispatcher reorders the rows it received by local expert when it
    sorts them unfused (``moe_permute_fusion=false``, more than one local expert): ``megatron``
    (megatron-core's own: one view per EP rank and local expert, concatenated; 128 at EP=16 with 8
    experts a GPU, and as many again in the backward) or ``gather`` (one row gather forward and one
    ``index_copy_`` backward, the same rows and gradients bitwise; ``models/torch_native/chunk_sort.py``).
    ``gather`` is refused where megatron-core would not sort unfused; the start-up line says it ran."""
    cross_entropy_fusion_impl: CrossEntropyImpl = "native"
    """Fused cross-entropy used when ``cross_entropy_loss_fusion`` is true: megatron-core's
    ``native`` (TorchScript) or ``te`` (needs Transformer Engine), or ``torch_native`` (this
    package's streaming Triton/PyTorch loss over bf16 logits, any device and TP size)."""
    torch_native_dispatcher: TorchNativeDispatcher = "auto"
    """MoE token dispatch of the torch-native layers: ``sorted`` (static-size sorted permutation,
    counts kept on the GPU; with EP > 1 the all-to-all runs on NVSHMEM symmetric memory, or over
    ``all_to_all_single`` with host split sizes where NVSHMEM is absent), ``megatron`` (megatron-core's
    alltoall dispatcher, which waits for the GPU before every all-to-all), or ``auto`` (``sorted``
    where it is exact and, with EP > 1, sync-free; ``megatron`` otherwise). The start-up line names
    the choice and the reason. ``node_aware``: two-stage EP dispatch that sends each token once per
    destination node over the inter-node link, then to its experts' GPUs inside the node (needs
    ``torch_native_gpus_per_node``; ``auto`` does not pick it: it is not measured yet)."""
    torch_native_gpus_per_node: int | None = None
    """GPUs per node for ``torch_native_dispatcher=node_aware``: ranks with the same ``global_rank //
    torch_native_gpus_per_node`` share a node. The harness sets it from ``-gn`` when the
    node-aware dispatcher is asked for; it must divide the EP size (or the EP size divide it: EP
    inside one node, one stage). ``None`` with another dispatcher (a value there is refused)."""
    torch_native_ep_transport: TorchNativeEPTransport = "auto"
    """With EP > 1, how the sorted dispatcher exchanges tokens: ``nvshmem`` (symmetric-memory
    all-to-all, split sizes stay on the GPU), ``nccl`` (``all_to_all_single``: the host waits for the
    split sizes), or ``auto`` (``nvshmem`` where NVSHMEM runs, else the dispatcher falls back)."""
    torch_native_rank_capacity_factor: float | None = None
    """With ``torch_native_dispatcher=sorted`` and EP > 1, the per-rank token budget of the experts'
    tensors: ``ceil(factor x tokens x top-k)`` rows a micro-batch, as megatron-core's
    ``moe_expert_rank_capacity_factor`` sizes HybridEP's and NCCL EP's (which megatron-core refuses
    outside the flex dispatcher). ``None``: the worst case, ``EP x tokens x min(top-k, local experts)``
    rows, which no routing exceeds. No token is dropped: a micro-batch over the budget stops the run
    after its backward, before the optimizer step, naming the factor it needed
    (``models/torch_native/expert_rows.py``). At least 1.0 (a balanced rank's share)."""
    torch_native_nvshmem_blocks: int | None = None
    """Thread blocks per NVSHMEM all-to-all (``None``: torch's choice, up to 64). Fewer blocks start
    sooner beside running GEMMs (the kernel needs all its blocks resident at once)."""
    torch_native_compile: bool = True
    """``torch.compile`` the torch-native layers' small fused functions on CUDA (RMSNorm, the experts'
    SwiGLU, the EP exchange plan); ``false`` runs them eagerly (A/B timing, debugging)."""
    torch_native_grouped_gemm_backend: GroupedGemmBackend = "auto"
    """Expert GEMMs of the torch-native layers: ``grouped_mm`` (``torch._grouped_mm``, bf16 on
    compute capability 9.0+), ``grouped_mm_padded`` (the same with each expert's rows padded to 16),
    ``loop`` (one matmul per expert), or ``auto`` (the first of those that runs here)."""
    torch_native_cross_entropy_backend: CrossEntropyBackend = "auto"
    """Kernels of the torch-native cross-entropy: ``triton`` (CUDA), ``torch`` (chunked PyTorch),
    or ``auto`` (Triton on CUDA where it imports, PyTorch elsewhere)."""
    torch_native_wgrad_accumulation: WgradAccumulation = "auto"
    """How the torch-native model's weight gradients reach DDP's fp32 ``main_grad``: ``fused`` (the
    experts' Triton grouped GEMM, and at tensor-parallel size 1 the dense projections' and output
    layer's cuBLAS GEMM, add their fp32 product into ``main_grad``: less memory traffic per
    micro-batch, no bf16 rounding of each micro-batch's gradient), ``unfused`` (a bf16 gradient that
    DDP's hook adds), ``auto`` (``fused`` where ``main_grad`` is fp32 on CUDA and the kernel runs)."""
    cuda_graph_modules: str | list[str] = field(default_factory=list)
    """CUDA-graph capture scopes; empty captures the whole layer (megatron-core's ``"full"``
    default means the same but is deprecated and warns)."""

    def __post_init__(self) -> None:  # noqa: D105 - deliberately deferred, see finalize()
        pass

    def finalize(self) -> None:
        """Derive the implementation fields and run megatron-core's own ``__post_init__``."""
        impl = self.resolved_layer_spec
        self.transformer_impl = "transformer_engine" if impl == "transformer_engine" else "local"
        TransformerConfig.__post_init__(self)

    @property
    def resolved_layer_spec(self) -> str:
        """The layer implementation this provider builds: ``layer_spec`` once a run's resolution
        has decided ``auto``; for a provider used on its own, the choice for this machine."""
        if self.layer_spec != "auto":
            return self.layer_spec
        return choose_for_model(self).name

    def padded_vocab_size(self) -> int:
        """Vocabulary rows of the embedding and output layers."""
        if self.vocab_size is None:
            raise ValueError("model.vocab_size is None; set it (e.g. model.vocab_size=151936).")
        return padded_vocab_size(self.vocab_size, self.make_vocab_size_divisible_by, self.tensor_model_parallel_size)

    @property
    def uses_torch_native_loss(self) -> bool:
        """Whether the language-model loss is the torch-native fused cross-entropy."""
        return self.cross_entropy_loss_fusion and self.cross_entropy_fusion_impl == "torch_native"

    def describe_loss(self, device_type: str) -> str:
        """One start-up line saying which cross-entropy implementation this run uses."""
        if self.uses_torch_native_loss:
            backend = select_backend(device_type, self.torch_native_cross_entropy_backend)
            return f"loss: torch_native fused cross-entropy ({backend} kernels)"
        if self.cross_entropy_loss_fusion:
            return f"loss: megatron-core fused cross-entropy ({self.cross_entropy_fusion_impl})"
        return "loss: megatron-core unfused vocab-parallel cross-entropy (fp32 logits)"

    def torch_native_kernels(self) -> dict[str, object]:
        """The torch-native kernel settings as configured (``summary.json`` and the start-up line)."""
        return dict(
            compile=self.torch_native_compile,
            grouped_gemm_backend=self.torch_native_grouped_gemm_backend,
            cross_entropy_backend=self.torch_native_cross_entropy_backend,
            wgrad_accumulation=self.torch_native_wgrad_accumulation,
        )

    def describe_torch_native_kernels(self) -> str:
        """One start-up line with the torch-native kernel settings."""
        k = self.torch_native_kernels()
        return (
            f"torch-native kernels: torch.compile {'on' if k['compile'] else 'off'}, grouped GEMM "
            f"{k['grouped_gemm_backend']}, cross-entropy {k['cross_entropy_backend']}"
        )

    def describe_gradient_accumulation_fusion(self, device_type: str) -> str | None:
        """The start-up line on ``gradient_accumulation_fusion`` (``None`` when it is off)."""
        if not self.gradient_accumulation_fusion:
            return None
        return grad_accumulation_fusion.describe(self.resolved_layer_spec, device_type)

    def model_class(self) -> type:
        """megatron-core's ``GPTModel``, or its subclass with the torch-native loss."""
        if self.uses_torch_native_loss:
            # Deferred: megatron-core's GPT model code is needed only to build a model; the
            # configuration, which holds this provider, is imported without it.
            from megatron.bridge.models.torch_native.gpt_model import TorchNativeLossGPTModel

            return TorchNativeLossGPTModel
        # Deferred, as above.
        from megatron.core.models.gpt import GPTModel

        return GPTModel

    def provide(
        self,
        pre_process: bool | None = None,
        post_process: bool | None = None,
        vp_stage: int | None = None,
    ) -> GPTModel:
        """Build this rank's ``GPTModel`` chunk (model-parallel state must be initialised).

        ``torch_native_compile`` applies to the whole process: the compiled functions are shared by
        every torch-native layer, so the model built last decides.
        """
        set_compile_enabled(self.torch_native_compile)
        if self.gradient_accumulation_fusion:
            provide_missing_kernel()  # megatron-core's linear layers refuse the flag without a kernel
        if pre_process is None:
            pre_process = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
        if post_process is None:
            post_process = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
        model = self.model_class()(
            config=self,
            transformer_layer_spec=build_decoder_block_spec(self, vp_stage=vp_stage),
            vocab_size=self.padded_vocab_size(),
            max_sequence_length=self.seq_length,
            pre_process=pre_process,
            post_process=post_process,
            fp16_lm_cross_entropy=self.fp16_lm_cross_entropy,
            parallel_output=self.parallel_output,
            share_embeddings_and_output_weights=self.share_embeddings_and_output_weights,
            position_embedding_type=self.position_embedding_type,
            rotary_percent=self.rotary_percent,
            rotary_base=int(self.rotary_base),
            vp_stage=vp_stage,
        )
        if self.resolved_layer_spec == "torch_native":
            if linear.reroutes_dense_layers(self):
                linear.route_weight_gradients_into_main_grad(model)
        if self.overlap_moe_expert_parallel_comm:
            keep_comm_stream_grads_for_accumulation(model)
        return model
