"""Tensor-subclass weights handed to the compiled graph as their inner tensors (lowering/subclass_weights.py): the
rewritten graph, the static inputs CUDA graphs rely on, weights changed after compiling, what stays as it is."""

import importlib

import expecttest
import pytest
import torch
import torch.nn as nn
from torch.testing._internal.two_tensor import TwoTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

import fa4_inductor
from fa4_inductor.lowering.subclass_weights import take_inner_tensors

backend_module = importlib.import_module("fa4_inductor.backend")  # the package's `backend` is the factory
pytestmark = pytest.mark.usefixtures("without_fx_graph_cache")  # conftest.py: a cache hit skips the passes


class Captured:
    """A backend that keeps Dynamo's graph and example inputs and runs the graph as traced."""

    def __init__(self):
        self.gm = self.inputs = None

    def __call__(self, gm, example_inputs):
        self.gm, self.inputs = gm, list(example_inputs)
        return gm.forward


def captured(model, *args) -> Captured:
    torch._dynamo.reset()
    capture = Captured()
    with torch.no_grad():
        torch.compile(model, backend=capture, fullgraph=True)(*args)
    return capture


def summary(gm: torch.fx.GraphModule) -> str:
    """Each placeholder with its Dynamo source, each other call with its arguments."""
    lines = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            lines.append(f"{node.name} <- {node._dynamo_source.name}")
        elif node.op != "output":
            args = ", ".join(str(a) for a in node.args)
            lines.append(f"{node.name} = {getattr(node.target, '__name__', node.target)}({args})")
    return "\n".join(lines)


def two_tensor_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8, bias=False), nn.Linear(8, 8))
    model[0].weight = nn.Parameter(TwoTensor(torch.randn(8, 8), torch.randn(8, 8)), requires_grad=False)
    return model.requires_grad_(False)


def torchao_int8_model() -> nn.Module:
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 48), nn.Linear(48, 32, bias=False)).to(torch.bfloat16)
    quantize_(model.requires_grad_(False), Int8WeightOnlyConfig(set_inductor_config=False))
    return model


class TestGraph(expecttest.TestCase):
    def test_a_subclass_weight_becomes_its_inner_tensors(self):
        model = two_tensor_model()
        capture = captured(model, torch.randn(2, 8))
        gm, inputs, args = take_inner_tensors(capture.gm, capture.inputs)
        self.assertExpectedInline(summary(gm), """\
l_fn_modules_0_parameters_weight__a <- L['fn']._modules['0']._parameters['weight'].a
l_fn_modules_0_parameters_weight__b <- L['fn']._modules['0']._parameters['weight'].b
l_args_0_ <- L['args'][0]
l_fn_modules_1_parameters_weight_ <- L['fn']._modules['1']._parameters['weight']
l_fn_modules_1_parameters_bias_ <- L['fn']._modules['1']._parameters['bias']
rebuild_two_tensor = rebuild_TwoTensor(l_fn_modules_0_parameters_weight__a, l_fn_modules_0_parameters_weight__b)
input_1 = linear(l_args_0_, rebuild_two_tensor, None)
input_2 = linear(input_1, l_fn_modules_1_parameters_weight_, l_fn_modules_1_parameters_bias_)""")
        weight = model[0].weight
        expected = [i for t in capture.inputs for i in ((t.a, t.b) if t is weight else (t,))]
        assert [id(t) for t in inputs] == [id(t) for t in expected]
        assert [id(t) for t in args.expand(capture.inputs)] == [id(t) for t in inputs]
        assert summary(capture.gm).count("<-") == 4  # Dynamo's own graph is left as it was


@pytest.mark.parametrize("on", [True, False], ids=["on", "option-off"])
def test_the_compiled_graph_takes_plain_static_inputs(monkeypatch, on):
    """Through the backend: Inductor gets no subclass, every inner tensor is a static input (AOTAutograd's
    `static_input_indices`, which CUDA graphs read: a non-static input is copied on every replay), and the torchao
    int8 linears are rewritten as before, eager's outputs bit for bit. With `subclass_weights=False` the subclasses
    reach Inductor, the same outputs."""
    pytest.importorskip("torchao")
    from torch._functorch import aot_autograd

    compiled_inputs, static = [], []
    compile_fx, metadata = backend_module.compile_fx, aot_autograd._try_get_metadata_from_dynamo

    def recording_compile_fx(gm, example_inputs, **kwargs):
        compiled_inputs.append(list(example_inputs))
        return compile_fx(gm, example_inputs, **kwargs)

    def recording_metadata(*args, **kwargs):
        sources, indices = metadata(*args, **kwargs)
        static.append(indices)
        return sources, indices

    monkeypatch.setattr(backend_module, "compile_fx", recording_compile_fx)
    monkeypatch.setattr(aot_autograd, "_try_get_metadata_from_dynamo", recording_metadata)
    model = torchao_int8_model()
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    torch._dynamo.reset()
    with torch.no_grad(), fa4_inductor.publishing.collecting() as records:
        out = torch.compile(model, backend=fa4_inductor.backend(subclass_weights=on))(x)
        expected = model(x)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)
    assert sum(r.rewritten and r.family == "int8_linear" for r in records) == 2, [str(r) for r in records]
    [inputs] = compiled_inputs
    if not on:
        assert sum(is_traceable_wrapper_subclass(t) for t in inputs) == 2
        return
    assert not any(is_traceable_wrapper_subclass(t) for t in inputs)
    weights = [getattr(model[i].weight, name) for i in (0, 1) for name in model[i].weight.__tensor_flatten__()[0]]
    positions = [next(p for p, t in enumerate(inputs) if t is w) for w in weights]
    assert set(positions) <= set(static[0]), (positions, static)


def test_dynamic_shapes():
    """Under `dynamic=True` the weights keep static shapes (Dynamo's `force_parameter_static_shapes`) and are taken;
    x's rows stay symbolic, and a second row count runs the same graph."""
    model = two_tensor_model()
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend(fa4_inductor.backend())
    compiled = torch.compile(model, backend=counter, dynamic=True)
    with torch.no_grad():
        for rows in (3, 5):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(compiled(x), model(x))
    assert counter.frame_count == 1
    capture = captured(model, torch.randn(3, 8))
    assert take_inner_tensors(capture.gm, capture.inputs) is not None


def test_weights_changed_after_compiling_are_read():
    """The inner tensors are read from the weight passed on each call: a weight written in place or replaced by
    another of the same kind after compiling gives the new output, without a recompile."""
    model = two_tensor_model()
    x = torch.randn(2, 8)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend(fa4_inductor.backend())
    compiled = torch.compile(model, backend=counter)
    with torch.no_grad():
        compiled(x)
        model[0].weight.a.mul_(-2.0)
        torch.testing.assert_close(compiled(x), model(x))
        model[0].weight = nn.Parameter(TwoTensor(torch.randn(8, 8), torch.randn(8, 8)), requires_grad=False)
        torch.testing.assert_close(compiled(x), model(x))
    assert counter.frame_count == 1


class WrittenInPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(TwoTensor(torch.randn(8, 8), torch.randn(8, 8)), requires_grad=False)

    def forward(self, x):
        self.w.mul_(0.5)
        return x @ self.w


class AddedInPlace(WrittenInPlace):
    def forward(self, x):
        w = self.w
        w += 1
        return x @ w


class Activation(nn.Module):
    def forward(self, x):
        return x * 2


@pytest.mark.parametrize("case", ["needs-gradient", "activation", "written-in-place", "added-in-place"])
def test_what_stays_a_subclass(case):
    """A weight that needs its gradient (training: AOTAutograd's subclass handling builds the gradient), a subclass
    activation (not a static input), and a weight the graph writes in place (a method, `+=`) reach
    AOTAutograd as they are."""
    x = torch.randn(2, 8)
    if case == "needs-gradient":
        model = two_tensor_model()
        model[0].weight.requires_grad_(True)
    elif case == "activation":
        model, x = Activation(), TwoTensor(torch.randn(2, 8), torch.randn(2, 8))
    else:
        model = {"written-in-place": WrittenInPlace, "added-in-place": AddedInPlace}[case]()
    capture = captured(model, x)
    assert any(is_traceable_wrapper_subclass(t) for t in capture.inputs)
    assert take_inner_tensors(capture.gm, capture.inputs) is None
