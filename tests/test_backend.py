"""The backend as users reach it: three spellings, torch.compile's mode/options, explain, training, dynamic shapes."""

import importlib.metadata

import pytest
import torch
import torch.nn.functional as F

import fa4_inductor
from fa4_inductor import Options
from fa4_inductor.backend import inductor_config_patches

from helpers import Recorder


def causal_gqa(q, k, v):
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def inputs(s=8, requires_grad=False):
    return [torch.randn(2, 4, s, 16, requires_grad=requires_grad),
            torch.randn(2, 2, s, 16, requires_grad=requires_grad),
            torch.randn(2, 2, s, 16, requires_grad=requires_grad)]


@pytest.mark.parametrize("spelling", ["module", "object", "name"])
def test_backend_spellings(spelling):
    backend = {"module": fa4_inductor, "object": fa4_inductor.fa4_inductor, "name": "fa4_inductor"}[spelling]
    torch._dynamo.reset()
    with fa4_inductor.report.collecting() as records:
        out = torch.compile(causal_gqa, backend=backend)(*(x := inputs()))
    torch.testing.assert_close(out, causal_gqa(*x), atol=1e-5, rtol=1e-5)
    assert [r.rewritten for r in records] == [True]


def test_entry_point_is_registered():
    (ep,) = [e for e in importlib.metadata.entry_points(group="torch_dynamo_backends") if e.name == "fa4_inductor"]
    assert ep.load() is fa4_inductor.fa4_inductor


def test_the_module_and_backends_survive_hf_compile_config():
    """HF's generate deep-copies its `CompileConfig`, backend included, on every call: a copy would be a new backend
    to Dynamo, which then recompiles the decode step each generate."""
    import copy

    assert copy.deepcopy(fa4_inductor) is fa4_inductor
    assert copy.deepcopy({"backend": fa4_inductor})["backend"] is fa4_inductor
    configured = fa4_inductor.backend(gqa=False)
    assert copy.deepcopy({"backend": configured})["backend"] is configured and copy.copy(configured) is configured


def test_mode_and_options_reach_inductor():
    assert inductor_config_patches("reduce-overhead", None) == {"triton.cudagraphs": True}
    assert inductor_config_patches(None, {"max_autotune": True}) == {"max_autotune": True}
    torch._dynamo.reset()
    out = torch.compile(causal_gqa, backend="fa4_inductor", options={"freezing": False})(*(x := inputs()))
    torch.testing.assert_close(out, causal_gqa(*x), atol=1e-5, rtol=1e-5)


def test_backend_options():
    assert fa4_inductor.backend(gqa=False).options == Options(gqa=False)
    with pytest.raises(TypeError, match="unknown fa4_inductor options"):
        fa4_inductor.backend(fold_everything=True)


def test_explain_reports_rewrites_and_fallbacks(capsys):
    def two_layers(q, k, v, m):
        a = causal_gqa(q, k, v)
        return F.scaled_dot_product_attention(a, a, a, attn_mask=m)

    torch._dynamo.reset()
    report = fa4_inductor.explain(two_layers, *inputs(), torch.randn(8, 8))
    assert len(report.rewritten) == 1 and len(report.kept) == 1
    printed = capsys.readouterr().out
    assert "1 rewritten, 1 kept as written" in printed
    assert "test_backend.py" in printed and "repeat_interleave folded, group 2" in printed
    assert "the mask is the graph input l_m_" in printed


def test_training_gradients_match_eager():
    torch._dynamo.reset()
    backend = Recorder(inductor=True)
    x = inputs(requires_grad=True)
    compiled = torch.compile(causal_gqa, backend=backend)
    out = compiled(*x)
    grads = torch.autograd.grad(out.pow(2).sum(), x)
    x64 = [t.detach().double().requires_grad_() for t in x]
    ref_grads = torch.autograd.grad(causal_gqa(*x64).pow(2).sum(), x64)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g.double(), r, atol=1e-5, rtol=1e-5)
    assert backend.count() == 1


def test_dynamic_sequence_length_compiles_once():
    torch._dynamo.reset()
    backend = Recorder(inductor=True)
    compiled = torch.compile(causal_gqa, backend=backend, dynamic=True)
    for s in (8, 13, 32):
        x = inputs(s)
        torch.testing.assert_close(compiled(*x), causal_gqa(*x), atol=1e-5, rtol=1e-5)
    assert len(backend.graphs) == 1 and backend.count() == 1


@pytest.mark.parametrize("name", ["kernels", "lowering"])
def test_repo_folders_imported_top_level_are_the_installed_packages(monkeypatch, name):
    """From the repo root a top-level import finds our folder, which must not register the ops a second time:
    `lowering` is the installed package; `kernels` is another installed package of that name where there is one
    (Hugging Face's hub kernels, which transformers >= 5.25 installs and imports), else ours as installed."""
    import importlib
    import pathlib
    import sys

    op = torch.ops.fa4.attention.default
    root = str(pathlib.Path(fa4_inductor.__file__).parents[1])
    monkeypatch.syspath_prepend(root)
    monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module(name)
    ours = importlib.import_module(f"fa4_inductor.{name}")
    assert module is ours or name == "kernels" and not module.__file__.startswith(root), module
    assert torch.ops.fa4.attention.default is op


def test_a_top_level_kernels_import_hands_out_another_kernels_package(monkeypatch, tmp_path):
    import importlib
    import pathlib
    import sys

    op = torch.ops.fa4.attention.default
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("WHOSE = 'the hub kernels stand-in'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(pathlib.Path(fa4_inductor.__file__).parents[1]))  # found first, as from the root
    monkeypatch.setitem(sys.modules, "kernels", None)  # what was there comes back after the test (or nothing)
    del sys.modules["kernels"]
    assert importlib.import_module("kernels").WHOSE == "the hub kernels stand-in"
    assert torch.ops.fa4.attention.default is op
