"""The post-grad stage (lowering/post_grad.py): POST_GRAD families see Inductor's aten graphs, forward and
backward, through `post_grad_custom_pre_pass`, and the FX graph cache keys compiled code by what the stage is."""

import logging

import pytest
import torch
from torch._dynamo.utils import counters

import fa4_inductor
from fa4_inductor import report
from fa4_inductor.lowering import passes, post_grad
from fa4_inductor.lowering.family import POST_GRAD, Family
from fa4_inductor.lowering.records import Decline
from fa4_inductor.options import Options

aten = torch.ops.aten


pytestmark = pytest.mark.usefixtures("without_fx_graph_cache")  # conftest.py: a cache hit skips the passes


def _sees_mm(node, context):
    raise Decline(f"seen: {node.target} of {list(node.meta['val'].shape)}")


MM_WATCHER = Family("mm_watcher", POST_GRAD, lambda n: n.target is aten.mm.default, _sees_mm)


def linear(x, w):
    return torch.relu(x @ w)


def test_post_grad_families_see_forward_and_backward_aten_graphs(monkeypatch):
    monkeypatch.setattr(passes, "FAMILIES", passes.FAMILIES + (MM_WATCHER,))
    seen = []
    monkeypatch.setattr(post_grad.PostGradPasses, "__call__",
                        _recording(post_grad.PostGradPasses.__call__, seen))
    torch._dynamo.reset()
    x, w = torch.randn(8, 16, requires_grad=True), torch.randn(16, 4, requires_grad=True)
    out = torch.compile(linear, backend=fa4_inductor.fa4_inductor)(x, w)
    out.sum().backward()
    torch.testing.assert_close(out, linear(x, w))
    details = sorted(r.detail for r in seen)
    assert details == sorted(f"seen: aten.mm.default of {s}" for s in ("[8, 4]", "[8, 16]", "[16, 4]"))
    assert all(r.family == "mm_watcher" and not r.rewritten for r in seen)


def _recording(call, seen):
    def wrapper(self, graph):
        call(self, graph)
        seen.extend(self.records)
        self.records.clear()
    return wrapper


def test_post_grad_records_are_published_for_inference(monkeypatch):
    monkeypatch.setattr(passes, "FAMILIES", passes.FAMILIES + (MM_WATCHER,))
    torch._dynamo.reset()
    with report.collecting() as records:
        torch.compile(linear, backend=fa4_inductor.fa4_inductor)(torch.randn(8, 16), torch.randn(16, 4))
    assert [(r.family, r.detail) for r in records] == [("mm_watcher", "seen: aten.mm.default of [8, 4]")]


def test_the_users_pass_on_the_hook_still_runs():
    calls = []

    def user_pass(graph):
        calls.append(len(graph.nodes))

    torch._dynamo.reset()
    out = torch.compile(linear, backend="fa4_inductor", options={"post_grad_custom_pre_pass": user_pass})(
        torch.randn(8, 16), torch.randn(16, 4))
    assert out.shape == (8, 4) and len(calls) == 1


def test_uuid_follows_the_options_the_sources_and_the_users_pass(monkeypatch):
    first = post_grad.PostGradPasses(Options()).uuid()
    assert post_grad.PostGradPasses(Options()).uuid() == first
    assert post_grad.PostGradPasses(Options(gqa=False)).uuid() != first
    assert post_grad.PostGradPasses(Options(), user_pass=_NamedPass("a")).uuid() != \
        post_grad.PostGradPasses(Options(), user_pass=_NamedPass("b")).uuid()
    monkeypatch.setattr(post_grad, "source_hash", lambda: "edited")
    assert post_grad.PostGradPasses(Options()).uuid() != first


class _NamedPass(torch._inductor.custom_graph_pass.CustomGraphPass):
    def __init__(self, name):
        self.name = name

    def __call__(self, graph):
        pass

    def uuid(self):
        return self.name


@pytest.fixture
def fx_graph_cache():
    with torch._inductor.config.patch(fx_graph_cache=True):
        yield


def _compile_fresh(x, w):
    torch._dynamo.reset()
    counters.clear()
    torch.compile(linear, backend=fa4_inductor.fa4_inductor)(x, w)
    return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"], \
        counters["inductor"]["fxgraph_cache_bypass"]


def test_fx_graph_cache_hits_until_the_sources_change(fx_graph_cache, monkeypatch):
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    assert _compile_fresh(x, w) == (0, 1, 0)
    assert _compile_fresh(x, w) == (1, 0, 0)
    monkeypatch.setattr(post_grad, "source_hash", lambda: "edited")
    assert _compile_fresh(x, w) == (0, 1, 0)


def test_a_graph_served_from_the_cache_says_its_post_grad_rewrites_are_not_listed(fx_graph_cache):
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    messages = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("fa4_inductor")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        assert _compile_fresh(x, w) == (0, 1, 0)
        assert not [m for m in messages if "served this graph's code from its caches" in m]
        assert _compile_fresh(x, w) == (1, 0, 0)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert [m for m in messages if "served this graph's code from its caches" in m]


def test_compiled_graphs_call_the_attention_twin_without_autograd():
    """Inside Inductor's forward and backward graphs no gradient is recorded: `fa4::attention` is called as
    `fa4::attention_forward`, and training still matches eager."""
    from torch._inductor.utils import run_and_get_code

    def attend(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = (torch.randn(2, 4, 16, 32, requires_grad=True) for _ in range(3))
    torch._dynamo.reset()
    compiled = torch.compile(attend, backend=fa4_inductor.fa4_inductor)
    out, (forward_code, *_) = run_and_get_code(compiled, q, k, v)
    assert "torch.ops.fa4.attention_forward.default(" in forward_code
    assert "torch.ops.fa4.attention.default(" not in forward_code
    expected = attend(q, k, v)
    torch.testing.assert_close(out, expected)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    torch.testing.assert_close(grads, torch.autograd.grad(expected.sum(), (q, k, v)))


def test_transposes_that_undo_each_other_are_folded():
    """`permute(permute(x, p), q)` composing to the identity reads x itself (a training graph's transpose of a
    subclass weight and its matmul's transpose back, which hid torchao NVFP4's codes from the family); other chains
    stay."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from fa4_inductor.lowering.graph_edit import fold_identity_permutes

    def f(x, y):
        return x.permute(1, 0).permute(1, 0) + 1, y.permute(1, 2, 0).permute(2, 0, 1), y.permute(1, 0, 2).permute(0, 2, 1)

    x, y = torch.randn(3, 4), torch.randn(2, 3, 4)
    gm = make_fx(f)(x, y)
    assert fold_identity_permutes(gm.graph) == 2
    gm.recompile()
    permutes = [n.args[1] for n in gm.graph.nodes if n.target is torch.ops.aten.permute.default]
    assert permutes == [[1, 0, 2], [0, 2, 1]], permutes
    for got, expected in zip(gm(x, y), f(x, y)):
        assert got.shape == expected.shape and got.stride() == expected.stride() and torch.equal(got, expected)
