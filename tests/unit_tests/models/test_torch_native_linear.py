"""Dense layers whose weight gradient goes straight into DDP's fp32 ``main_grad`` (``linear.py``).

The cuBLAS GEMM with an fp32 result (``addmm(out_dtype=)``) has no CPU kernel; here a stand-in with
the same contract plays it, so what is checked on CPU is everything around it: which calls are taken
over, that forward, input gradient and the accumulated weight gradient equal megatron-core's own
layers, the DDP hand-off, and which layers of a built model are switched. On GPUs the start-up line
and ``summary.json`` (``dense_wgrad_accumulation``) name the path that ran.
"""

import pytest
import torch

from megatron.bridge.models.torch_native import linear


@pytest.fixture()
def cpu_accumulation(monkeypatch):
    """``main_grad += dy^T x`` on CPU fp32 tensors, in place of the CUDA-only GEMM."""
    monkeypatch.setattr(linear, "can_fuse", lambda main_grad: main_grad.dtype == torch.float32)
    monkeypatch.setattr(
        linear, "accumulate_dense_wgrad", lambda dy, x, main_grad: main_grad.add_(dy.t().float() @ x.float())
    )


def _pair(kind, config):
    """A megatron-core layer and a rerouted copy with the same weights, the copy holding a DDP main_grad."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    cls, extra = {
        "column": (ColumnParallelLinear, dict(gather_output=False)),
        "row": (RowParallelLinear, dict(input_is_parallel=True, skip_bias_add=True)),
    }[kind]
    make = lambda: cls(32, 48, config=config, init_method=torch.nn.init.xavier_normal_, bias=False, **extra)  # noqa: E731
    reference, rerouted = make(), make()
    rerouted.load_state_dict(reference.state_dict())
    assert linear.route_weight_gradients_into_main_grad(rerouted) == 1
    rerouted.weight.main_grad = torch.zeros_like(rerouted.weight, dtype=torch.float32)
    rerouted.weight.grad_added_to_main_grad = False
    return reference, rerouted


@pytest.mark.parametrize("kind", ["column", "row"])
def test_rerouted_layer_matches_megatron_and_accumulates_into_main_grad(
    model_parallel, tiny_moe_config, cpu_accumulation, kind
):
    reference, rerouted = _pair(kind, tiny_moe_config())
    for _ in range(2):  # two micro-batches: main_grad collects both
        x = torch.randn(5, 2, 32)
        x_ref, x_new = x.clone().requires_grad_(), x.clone().requires_grad_()
        (y_ref, _), (y_new, _) = reference(x_ref), rerouted(x_new)
        dy = torch.randn_like(y_ref)
        y_ref.backward(dy)
        y_new.backward(dy)
        torch.testing.assert_close(y_new, y_ref, rtol=0, atol=0)
        torch.testing.assert_close(x_new.grad, x_ref.grad)
    torch.testing.assert_close(rerouted.weight.main_grad, reference.weight.grad)
    # DDP's hook skips its add (the gradient is already in main_grad) and still sees a gradient.
    assert rerouted.weight.grad_added_to_main_grad is True
    assert rerouted.weight.grad.shape == rerouted.weight.shape


@pytest.mark.parametrize("kind", ["column", "row"])
def test_main_grad_is_reached_under_saved_tensor_hooks(model_parallel, tiny_moe_config, cpu_accumulation, kind):
    """megatron-core's fine-grained activation offloading runs the forward under saved-tensor hooks,
    which give the backward a plain-tensor alias of the weight: its gradient still reaches the
    parameter's main_grad, and DDP's flag is set on the parameter."""
    reference, rerouted = _pair(kind, tiny_moe_config())
    x = torch.randn(5, 2, 32)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        (y_ref, _), (y_new, _) = reference(x), rerouted(x)
    dy = torch.randn_like(y_ref)
    y_ref.backward(dy)
    y_new.backward(dy)
    torch.testing.assert_close(rerouted.weight.main_grad, reference.weight.grad)
    assert rerouted.weight.grad_added_to_main_grad is True


@pytest.mark.parametrize(
    "call",
    [
        dict(sequence_parallel=True),  # tensor parallel: the input is all-gathered in megatron's function
        dict(allreduce_dgrad=True),
        dict(grad_output_buffer=[]),  # deferred embedding wgrad
        dict(gradient_accumulation_fusion=True),  # megatron's own (Apex) fusion
        dict(gtp_remat_size=2),
    ],
)
def test_calls_it_cannot_take_over_exactly_stay_with_megatron(cpu_accumulation, call):
    weight = torch.nn.Parameter(torch.randn(4, 3))
    weight.main_grad = torch.zeros(4, 3)
    assert linear._takes_over(weight, {}, "auto")
    assert not linear._takes_over(weight, call, "auto")


def test_megatron_fsdp_parameters_stay_with_megatron(cpu_accumulation):
    weight = torch.nn.Parameter(torch.randn(4, 3))
    weight.main_grad = torch.zeros(4, 3)
    weight.__fsdp_param__ = True
    assert not linear._takes_over(weight, {}, "auto")


@pytest.mark.parametrize(
    "setting,main_grad_dtype,expected",
    [
        ("auto", torch.float32, True),
        ("unfused", torch.float32, False),
        ("auto", torch.bfloat16, False),
        ("fused", torch.float32, True),
        ("auto", None, False),
    ],
)
def test_the_setting_decides_per_weight(cpu_accumulation, setting, main_grad_dtype, expected):
    weight = torch.nn.Parameter(torch.randn(4, 3))
    if main_grad_dtype is not None:
        weight.main_grad = torch.zeros(4, 3, dtype=main_grad_dtype)
    assert linear.fuses_into_main_grad(weight, setting) is expected


def test_explicit_fused_refuses_a_main_grad_it_cannot_fill():
    weight = torch.nn.Parameter(torch.randn(4, 3))
    weight.main_grad = torch.zeros(4, 3, dtype=torch.float32)  # on CPU: no fp32-output GEMM kernel
    with pytest.raises(RuntimeError, match="torch_native_wgrad_accumulation='fused'.*cpu"):
        linear.fuses_into_main_grad(weight, "fused")


def test_cpu_main_grad_is_left_to_ddp():
    """Without the stand-in: a CPU ``main_grad`` cannot be filled by cuBLAS, so ``auto`` keeps DDP's add."""
    weight = torch.nn.Parameter(torch.randn(4, 3))
    weight.main_grad = torch.zeros(4, 3)
    assert not linear.fuses_into_main_grad(weight, "auto")


@pytest.mark.parametrize(
    "changes,rerouted",
    [
        ({}, True),
        ({"tensor_model_parallel_size": 2}, False),
        ({"gradient_accumulation_fusion": True}, False),
        ({"defer_embedding_wgrad_compute": True}, False),
    ],
)
def test_which_configs_get_the_rerouted_layers(tiny_moe_config, changes, rerouted):
    config = tiny_moe_config()
    for name, value in changes.items():
        object.__setattr__(config, name, value)
    assert linear.reroutes_dense_layers(config) is rerouted


@pytest.mark.parametrize(
    "spec,changes,reported",
    [
        ("torch_native", {}, "fused"),
        (
            "torch_native",
            {"tensor_model_parallel_size": 2},
            "megatron-core's linear layers (tensor_model_parallel_size=2;",
        ),
        (
            "torch_native",
            {"gradient_accumulation_fusion": True},
            "(gradient_accumulation_fusion (megatron's own fusion);",
        ),
        ("local", {"tensor_model_parallel_size": 2}, None),  # megatron's layer specs: nothing to report
    ],
)
def test_report_names_the_dense_path_and_why_megatron_keeps_it(
    model_parallel, tiny_moe_config, spec, changes, reported
):
    """The start-up line and ``summary.json`` (``dense_wgrad_accumulation``) for a built model."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    config = tiny_moe_config()
    object.__setattr__(config, "resolved_layer_spec", spec)
    model = torch.nn.Sequential(
        ColumnParallelLinear(
            32, 48, config=config, init_method=torch.nn.init.xavier_normal_, bias=False, gather_output=False
        )
    )
    for name, value in changes.items():  # after construction: megatron's layer refuses Apex fusion without Apex
        object.__setattr__(config, name, value)
    if spec == "torch_native" and linear.reroutes_dense_layers(config):
        linear.route_weight_gradients_into_main_grad(model)
        model[0].weight.main_grad = torch.zeros(48, 32)
    report = linear.dense_wgrad_accumulation([model])
    if reported is None:
        assert report is None
    elif reported == "fused":
        assert report["layers"] == 1 and report["path"] in ("fused", "unfused")
    else:
        assert report["path"] == "megatron" and reported in report["description"]
