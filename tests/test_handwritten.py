"""Hand-written `softmax(q @ k^T * scale + mask) @ v` -> `fa4::attention`, every spelling of every step."""

import math

import expecttest
import pytest
import torch
import torch.nn.functional as F

import upstream
from helpers import Recorder, compile_and_record

# One description of the pattern: each step and the spellings models use for it. A variant picks one
# spelling per step (the first is the default), so each spelling is tested against the defaults.
SCORES = {
    "at_mT": lambda q, k: q @ k.mT,
    "matmul_transpose": lambda q, k: torch.matmul(q, k.transpose(-2, -1)),
    "method_transpose23": lambda q, k: q.matmul(k.transpose(2, 3)),
    "permute": lambda q, k: q @ k.permute(0, 1, 3, 2),
    "einsum": lambda q, k: torch.einsum("bhid,bhjd->bhij", q, k),
    "einsum_spaced_heads_last": lambda q, k: torch.einsum("b i h d, b j h d -> b h i j", q.transpose(1, 2),
                                                          k.transpose(1, 2)),
}
SCALE = {
    "mul_scores": lambda s, q, c: (s(q * 1.0) * c),
    "div_scores": lambda s, q, c: s(q) / (1.0 / c),
    "mul_q": lambda s, q, c: s(q * c),
    "mul_both_sides": lambda s, q, c: s(q * math.sqrt(c)) * math.sqrt(c),
}


def _tril(n):
    return torch.tril(torch.ones(n, n))


MASK = {
    "masked_fill_tril_eq0": lambda s, n: s.masked_fill(_tril(n) == 0, float("-inf")),
    "none": lambda s, n: s,
    "where_tril_bool_finfo_min": lambda s, n: torch.where(_tril(n).bool(), s, torch.finfo(s.dtype).min),
    "add_triu_minus_inf": lambda s, n: s + torch.full((n, n), float("-inf"), dtype=s.dtype).triu(1),
    "add_finfo_min_band": lambda s, n: s + torch.zeros(n, n, dtype=s.dtype).masked_fill(_tril(n) == 0, torch.finfo(s.dtype).min),
    "masked_fill_not_bool_tril": lambda s, n: s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf")),
}
SOFTMAX = {
    "F_softmax": lambda s, q: F.softmax(s, dim=-1),
    "torch_softmax": lambda s, q: torch.softmax(s, -1),
    "method_softmax": lambda s, q: s.softmax(dim=3),
    "float32_then_to": lambda s, q: F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype),
    "float_then_type_as": lambda s, q: s.float().softmax(-1).type_as(q),
}
DROPOUT = {
    "none": lambda p: p,
    "p0": lambda p: F.dropout(p, p=0.0),
    "eval": lambda p: F.dropout(p, p=0.1, training=False),
    # XGLM's views for `output_attentions`: the weights' shape and back, a no-op between softmax and @ v
    "view_round_trip": lambda p: p.view(p.shape[0] * p.shape[1], *p.shape[2:]).view(p.shape),
}
STEPS = {"scores": SCORES, "scale": SCALE, "mask": MASK, "softmax": SOFTMAX, "dropout": DROPOUT}


def attention_fn(scores, scale, mask, softmax, dropout):
    def fn(q, k, v):
        s = SCALE[scale](lambda x: SCORES[scores](x, k), q, 1 / math.sqrt(q.shape[-1]))
        s = MASK[mask](s, q.shape[-2])
        return DROPOUT[dropout](SOFTMAX[softmax](s, q)) @ v

    return fn


def variants():
    base = {step: next(iter(choices)) for step, choices in STEPS.items()}
    for step, choices in STEPS.items():
        for choice in choices:
            if choice != base[step] or step == "scores":
                yield pytest.param({**base, step: choice}, id=f"{step}={choice}")


def inputs(hq=4, hkv=4, s=6, d=16, dtype=torch.float32):
    return (torch.randn(2, hq, s, d, dtype=dtype), torch.randn(2, hkv, s, d, dtype=dtype),
            torch.randn(2, hkv, s, d, dtype=dtype))


@pytest.mark.parametrize("choice", variants())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_variant_is_rewritten_and_matches_eager(choice, dtype):
    fn = attention_fn(**choice)
    q, k, v = inputs(dtype=dtype)
    rec, out = compile_and_record(fn, q, k, v)
    assert rec.count() == 1, rec.records
    (node,) = [n for g in rec.graphs for n in g.graph.nodes if n.target is torch.ops.fa4.attention.default]
    assert node.kwargs.get("causal", False) == (choice["mask"] != "none")
    assert node.kwargs["scale"] == pytest.approx(0.25)
    expected = fn(q.double(), k.double(), v.double())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)


def test_bmm_on_merged_heads():
    def fn(q, k, v):  # [B * H, S, D]
        return torch.softmax(torch.bmm(q, k.transpose(1, 2)) / 4.0, dim=-1).bmm(v)

    q, k, v = (torch.randn(6, 5, 16) for _ in range(3))
    rec, out = compile_and_record(fn, q, k, v)
    assert rec.count() == 1
    torch.testing.assert_close(out, fn(q, k, v), atol=1e-5, rtol=1e-5)


def left_padded_keys():
    """A [2, 6] key mask whose second sequence's first 3 keys are padding (its first 3 query rows see no key under a
    causal band)."""
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, :3] = False
    return mask


def assert_output_and_gradients_match(out, expected, leaves):
    """out and the gradients of out.square().sum() with respect to `leaves` as `expected`'s (eager's)."""
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.autograd.grad(out.square().sum(), leaves),
                               torch.autograd.grad(expected.square().sum(), leaves), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fill", ["masked_fill", "where", "added"])
def test_rows_that_see_no_key_get_eagers_gradient_for_each_fill(fill):
    """A finfo.min padding and causal mask in training, applied by masked_fill, where or + (HF's eager code): a row
    that sees no key is the mean of V in eager either way, but its gradient reaches q and k only through the added
    mask (the absorbed scores stay in the softmax's graph), a fill passes none: the rewrite gives each, against
    eager."""
    def attend(q, k, v, mask):
        sim = (q * 0.25) @ k.mT
        allowed = mask[:, None, None, :] & torch.ones(sim.shape[-2:], dtype=torch.bool).tril()
        low = torch.finfo(sim.dtype).min
        if fill == "masked_fill":
            sim = sim.masked_fill(~allowed, low)
        elif fill == "where":
            sim = torch.where(allowed, sim, low)
        else:
            sim = sim + torch.zeros(allowed.shape).masked_fill(~allowed, low)
        return sim.softmax(dim=-1) @ v

    q, k, v = (t.requires_grad_() for t in inputs())
    mask = left_padded_keys()
    rec, out = compile_and_record(attend, q, k, v, mask)
    assert rec.count() == 1 and "rows that see no key: mean of V" in rec.records[0].detail, rec.records
    assert_output_and_gradients_match(out, attend(q, k, v, mask), (q, k, v))


def test_fills_apart_by_a_scale_are_not_one_step():
    """Two finfo.min fills with a scale between them leave a row that sees no key two different scores (the scaled
    fill and the fill), so eager weighs part of its keys: kept as written with the reason, output eager's."""
    def attend(q, k, v, mask):
        low = torch.finfo(q.dtype).min
        sim = (q @ k.mT).masked_fill(~mask[:, None, None, :], low) * 0.5
        sim = sim.masked_fill(torch.ones(sim.shape[-2:], dtype=torch.bool).triu(1), low)
        return sim.softmax(dim=-1) @ v

    q, k, v = inputs()
    mask = left_padded_keys()
    rec, out = compile_and_record(attend, q, k, v, mask)
    assert rec.count() == 0 and "weighted over part of the keys" in rec.reasons[0], rec.reasons
    torch.testing.assert_close(out, attend(q, k, v, mask))


def test_einsum_attention_under_dynamic_true_compiles_once():
    """Two lengths under `dynamic=True`, one graph: making the einsums' matmul nodes keeps the lengths symbolic (on
    torch 2.11 a batched matmul's fake value guarded them to the first call's, a recompile for every length)."""
    def attend(q, k, v, bias):
        scores = torch.einsum("b h i d, b h j d -> b h i j", q, k) * 0.25 + bias
        return torch.einsum("b h i j, b h j d -> b h i d", scores.softmax(dim=-1), v)

    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(attend, backend=recorder, dynamic=True)
    for s in (6, 9):
        q, k, v = inputs(s=s)
        bias = torch.randn(2, 1, s, s)
        torch.testing.assert_close(compiled(q, k, v, bias), attend(q, k, v, bias))
    assert len(recorder.graphs) == 1 and recorder.count() == 1, recorder.reasons


LEFT_PADDING = torch.tensor([[1] * 6, [0] * 3 + [1] * 3])  # left padding: rows 0-2 of batch 1 see no key


def padded_causal_bias(q, attention_mask):
    """HF eager code's additive mask: 0 where the causal band and the padding mask show a key, finfo.min elsewhere."""
    n = q.shape[-2]
    visible = torch.ones(n, n, dtype=torch.bool).tril()[None, None] & attention_mask.bool()[:, None, None, :]
    return torch.zeros(visible.shape, dtype=q.dtype).masked_fill(~visible, torch.finfo(q.dtype).min)


def assert_trains_as_float64(fn, sinks: bool = True):
    """fn(q, k, v[, sinks], attention_mask) compiled over `LEFT_PADDING` with every input needing a gradient: one
    attention rewritten, out and every gradient (the sinks' too) as float64 eager's; with sinks, the rows that see no
    key 0. Returns the records."""
    leaves = [t.clone().requires_grad_() for t in (*inputs(), *([torch.randn(4)] if sinks else []))]
    rec, out = compile_and_record(fn, *leaves, LEFT_PADDING)
    assert rec.count() == 1, rec.reasons
    out.square().sum().backward()
    exact = [t.detach().double().requires_grad_() for t in leaves]
    expected = fn(*exact, LEFT_PADDING)
    expected.square().sum().backward()
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    assert not sinks or out[1, :, :3].abs().max().item() == 0.0
    for got, want in zip(leaves, exact):
        torch.testing.assert_close(got.grad.double(), want.grad, atol=1e-5, rtol=1e-5)
    return rec


class TestHandwrittenGraphs(expecttest.TestCase):
    def test_nanogpt_buffer_mask(self):
        m = upstream.CausalSelfAttention().eval()
        x = torch.randn(2, 10, 32)
        rec, out = compile_and_record(m, x)
        torch.testing.assert_close(out, m(x), atol=1e-5, rtol=1e-5)
        self.assertExpectedInline(rec.summary, """\
fa4_attention: (f32[2, 2, 10, 16], f32[2, 2, 10]) = fa4.attention(.transpose(.view(getitem(..., 0), 2, 10, 2, 16), 1, 2), .transpose(.view(getitem(..., 1), 2, 10, 2, 16), 1, 2), .transpose(.view(getitem(..., 2), 2, 10, 2, 16), 1, 2), scale=0.25, causal=True)
attention_out: f32[2, 2, 10, 16] = getitem(fa4_attention, 0)""")

    def test_softcap_and_window(self):
        def fn(q, k, v):
            s = q @ k.transpose(-1, -2) * 0.25
            s = torch.tanh(s / 30.0) * 30.0
            n = q.shape[-2]
            band = torch.ones(n, n, dtype=torch.bool).tril().triu(-3)
            s = s.masked_fill(~band, float("-inf"))
            return s.softmax(-1) @ v

        q, k, v = inputs(d=16, s=9)
        rec, out = compile_and_record(fn, q, k, v)
        torch.testing.assert_close(out, fn(q, k, v), atol=1e-5, rtol=1e-5)
        self.assertExpectedInline(rec.summary, """\
fa4_attention: (f32[2, 4, 9, 16], f32[2, 4, 9]) = fa4.attention(q, k, v, scale=0.25, causal=True, window_left=3, softcap=30)
attention_out: f32[2, 4, 9, 16] = getitem(fa4_attention, 0)
attention_out_contiguous: f32[2, 4, 9, 16] = .contiguous(attention_out)""")

    def test_inside_an_activation_checkpoint_reads_the_mask_buffer(self):
        """nanoGPT's layer under `torch.utils.checkpoint`: Dynamo writes the region as a subgraph whose inputs are its
        operands; the `bias` buffer is one, read by value as at the top level. Forward and gradients as eager."""
        from torch.utils.checkpoint import checkpoint

        m = upstream.CausalSelfAttention(dropout=0.0)

        def fn(x):
            return checkpoint(m, x, use_reentrant=False)

        x = torch.randn(2, 10, 32, requires_grad=True)
        rec, out = compile_and_record(fn, x)
        expected = fn(x)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        grad = torch.randn_like(out)
        for got, want in zip(torch.autograd.grad(out, [x, *m.parameters()], grad),
                             torch.autograd.grad(expected, [x, *m.parameters()], grad)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        self.assertEqual([r.rewritten for r in rec.records], [True])
        self.assertIn("causal=True", rec.records[0].detail)

    def test_mixed_dtypes_without_autocast_stay_as_written(self):
        """float32 scores cast to a bfloat16 v's dtype, no autocast: q, k's precision is the model's choice, kept."""
        def fn(q, k, v):
            return torch.softmax(q @ k.mT * 0.25, -1).to(v.dtype) @ v

        q, k, v = inputs()
        rec, out = compile_and_record(fn, q, k, v.bfloat16())
        torch.testing.assert_close(out, fn(q, k, v.bfloat16()))
        self.assertEqual(rec.reasons, ["q, k, v dtypes differ (torch.float32, torch.float32, torch.bfloat16)"])

    def test_a_float_mask_input_becomes_sdpa_with_the_mask(self):
        """A float [Sq, Sk] mask input added to the scores, any values: the SDPA call with that mask (its finite values
        floored by `floor_additive`, where CUDA's kernels still average V over a row of finfo.min), which computes what
        eager does, a row the mask hides every key of made NaN after it as eager's softmax makes it; the op takes an
        additive mask of generate's 4-D shapes only."""
        def fn(q, k, v, m):
            return torch.softmax(q @ k.mT * 0.25 + m, -1) @ v

        q, k, v = inputs()
        m = torch.randn(6, 6) * 4
        rec, out = compile_and_record(fn, q, k, v, m)
        self.assertEqual(rec.count(), 0)
        torch.testing.assert_close(out.double(), fn(q.double(), k.double(), v.double(), m.double()), atol=1e-5,
                                   rtol=1e-5)
        self.assertExpectedInline(rec.summary, """\
mask_floored: f32[6, 6] = floor_additive(m)
mask_rebased: f32[6, 6] = rebased_additive_mask(mask_floored)
sdpa_mask_input: f32[2, 4, 6, 16] = scaled_dot_product_attention(q, k, v, attn_mask=mask_rebased, scale=0.25)
rows_without_keys: f32[6, 1] = nan_where_no_key(m)
attention_out_nan_rows: f32[2, 4, 6, 16] = mul(sdpa_mask_input, rows_without_keys)
attention_out_contiguous: f32[2, 4, 6, 16] = .contiguous(attention_out_nan_rows)""")

    def test_a_decode_steps_float_mask_input_goes_to_the_op(self):
        """`additive_masks_on_op`: one query over a cache of 9 keys, repeated K/V, a softcap and a float mask input
        [B, 1, 1, Sk] added to the scores: the op with the mask as its additive [B, Sk] key_mask, K/V un-repeated."""
        def step(q, k, v, m):
            k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
            s = torch.tanh(q @ k.mT * 0.25 / 30.0) * 30.0
            return torch.softmax(s + m[:, :, :, :9], -1) @ v

        q, k, v = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16)
        m = (torch.randn(2, 1, 1, 12) * 3).masked_fill(torch.rand(2, 1, 1, 12) < 0.3, torch.finfo(torch.float32).min)
        rec, out = compile_and_record(step, q, k, v, m)
        self.assertEqual(rec.count(), 1)
        expected = step(q.double(), k.double(), v.double(), m.double().clamp_min(-1e300))
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
        self.assertExpectedInline(rec.summary, """\
getitem: f32[2, 9] = getitem(getitem(m, (:, :, :, :9)), (:, 0, 0))
mask_rebased: f32[2, 9] = rebased_additive_mask(getitem)
fa4_attention: (f32[2, 4, 1, 16], f32[2, 4, 1]) = fa4.attention(q, k, v, None, mask_rebased, scale=0.25, softcap=30)
attention_out: f32[2, 4, 1, 16] = getitem(fa4_attention, 0)
rows_without_keys: f32[2, 1, 1, 1] = nan_where_no_key(getitem(m, (:, :, :, :9)))
attention_out_nan_rows: f32[2, 4, 1, 16] = mul(attention_out, rows_without_keys)
attention_out_contiguous: f32[2, 4, 1, 16] = .contiguous(attention_out_nan_rows)""")
        rec, _ = compile_and_record(step, q, k, v, m, additive_masks_on_op=False)  # kept (SDPA has no softcap)
        self.assertEqual(rec.count(), 0)

    def test_a_prefills_float_mask_input_goes_to_the_op(self):
        """`additive_masks_on_op`: a prefill of 5 queries over a static cache of 8 keys, repeated K/V and generate's
        float mask input [1, 1, Sq, Sk] (left-padded causal, 0 and finfo.min): the op with an additive [B, Sq, Sk]
        key_mask copied by `fa4::key_mask` (which the op reads on the host, kernels/attention.py); K/V
        un-repeated. With a softcap the prefill stays as written."""
        def prefill(q, k, v, m):
            k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
            return torch.softmax(q @ k.mT * 0.25 + m, -1) @ v

        q, k, v = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 16)
        visible = torch.ones(5, 8, dtype=torch.bool).tril()
        visible[:, :2] = False  # two pad tokens: rows 0 and 1 see no key
        m = torch.zeros(1, 1, 5, 8).masked_fill(~visible, torch.finfo(torch.float32).min)
        rec, out = compile_and_record(prefill, q, k, v, m)
        self.assertEqual(rec.count(), 1)
        torch.testing.assert_close(out, prefill(q, k, v, m), atol=1e-5, rtol=1e-5)
        self.assertExpectedInline(rec.summary, """\
getitem: f32[1, 5, 8] = getitem(m, (:, 0))
mask_rebased: f32[1, 5, 8] = rebased_additive_mask(getitem)
expand: f32[2, 5, 8] = .expand(mask_rebased, 2, 5, 8)
key_mask: f32[2, 5, 8] = fa4.key_mask(expand, additive=True)
fa4_attention: (f32[2, 4, 5, 16], f32[2, 4, 5]) = fa4.attention(q, k, v, None, key_mask, scale=0.25)
attention_out: f32[2, 4, 5, 16] = getitem(fa4_attention, 0)
rows_without_keys: f32[1, 1, 5, 1] = nan_where_no_key(m)
attention_out_nan_rows: f32[2, 4, 5, 16] = mul(attention_out, rows_without_keys)
attention_out_contiguous: f32[2, 4, 5, 16] = .contiguous(attention_out_nan_rows)""")

        def capped(q, k, v, m):
            k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
            return torch.softmax(torch.tanh(q @ k.mT * 0.25 / 30.0) * 30.0 + m, -1) @ v

        rec, _ = compile_and_record(capped, q, k, v, m)
        self.assertEqual(rec.count(), 0)
        self.assertIn("with a softcap, which SDPA has not", rec.reasons[0])

    def test_a_finite_fill_added_as_a_causal_mask_is_the_causal_band(self):
        """An additive causal mask built in the graph with -1e9 or old code's -1e4 (`(1 - keep) * -10000`), in a
        hand-written softmax and as SDPA's float attn_mask: every row sees its diagonal, where the fill weighs nothing,
        so the op's causal band computes it (forward and gradients against float64). Under a run-time padding mask
        a row may see no key, which such a fill leaves the softmax of its scores over every key in float64: not the
        band then, but the mask's values on the op, rebased (`rebased_additive_mask`), as float64 has them."""
        def added(q, k, v):
            keep = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).tril()
            s = q @ k.mT * 0.25 + torch.zeros(keep.shape, dtype=q.dtype).masked_fill(~keep, -1e9)
            return s.softmax(-1) @ v

        def old_gpt2(q, k, v):
            keep = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).tril()
            return (q @ k.mT * 0.25 + (1.0 - keep.to(q.dtype)) * -10000.0).softmax(-1) @ v

        def sdpa(q, k, v):
            keep = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).tril()
            mask = torch.zeros(keep.shape, dtype=q.dtype).masked_fill(~keep, -1e9)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25)

        for fn in (added, old_gpt2, sdpa):
            with self.subTest(fn.__name__):
                q, k, v = (t.requires_grad_() for t in inputs())
                rec, out = compile_and_record(fn, q, k, v)
                self.assertEqual(rec.count(), 1)
                self.assertIn("scale=0.25, causal=True)", rec.summary)
                exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
                expected = fn(*exact)
                torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
                w = torch.randn(out.shape, dtype=torch.float64)
                for g, e in zip(torch.autograd.grad((out.double() * w).sum(), (q, k, v)),
                                torch.autograd.grad((expected * w).sum(), exact)):
                    torch.testing.assert_close(g.double(), e, atol=1e-5, rtol=1e-5)

        def padded(q, k, v, attention_mask):
            keep = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool).tril() & attention_mask.bool()[:, None, None]
            return (q @ k.mT * 0.25 + torch.zeros(keep.shape, dtype=q.dtype).masked_fill(~keep, -1e9)).softmax(-1) @ v

        q, k, v = inputs()
        rec, out = compile_and_record(padded, q, k, v, LEFT_PADDING)
        self.assertEqual(rec.count(), 1)  # taken again as a run-time mask: its values, rebased, on the op
        self.assertIn("key_mask=additive mask input", rec.records[0].detail)
        self.assertIn("rebased_additive_mask", rec.summary)
        torch.testing.assert_close(out.double(), padded(q.double(), k.double(), v.double(), LEFT_PADDING),
                                   atol=1e-5, rtol=1e-5)

    def test_a_float_mask_inputs_rows_are_rebased_to_their_largest_values(self):
        """A float mask input whose row adds -1e9 to every key (a query that sees no key, older code's fill): in
        float64 that row is the softmax of its scores; next to -1e9 float32 keeps its scores only in steps of 64.
        Each row goes to the op (prefill: per query row; decode step: one row) and to SDPA ([Sq, Sk], one for the
        batch) less its largest value, so out and the gradients match float64 eager on every row, where eager's own
        float32 does not. A row of finfo.min (every dtype absorbs the scores there: uniform) is kept."""
        def attend(q, k, v, m):
            return torch.softmax(q @ k.mT * 2.0 + m, -1) @ v

        def per_query_mask():
            m = torch.randn(1, 1, 5, 7).masked_fill(torch.rand(1, 1, 5, 7) < 0.3, -1e9)
            m[..., 0, :] = -1e9 + torch.randn(7).round()
            m[..., 1, :] = torch.finfo(torch.float32).min
            return m

        one_row = torch.randn(2, 1, 1, 7).masked_fill(torch.rand(2, 1, 1, 7) < 0.3, -1e9)
        one_row[1] = -1e9
        cases = [("per query", (2, 4, 5, 16), per_query_mask(), True, "fa4.attention(q, k, v, None, key_mask"),
                 ("one row", (2, 4, 1, 16), one_row, False, "fa4.attention(q, k, v, None, mask_rebased"),
                 ("sdpa", (2, 4, 5, 16), per_query_mask()[0, 0], False, "attn_mask=mask_rebased")]
        for name, q_shape, m, grad, used in cases:
            with self.subTest(name):
                q = torch.randn(q_shape, requires_grad=grad)
                k, v = (torch.randn(2, 4, 7, 16, requires_grad=grad) for _ in range(2))
                rec, out = compile_and_record(attend, q, k, v, m)
                self.assertIn(used, rec.summary)
                self.assertIn("rebased_additive_mask", rec.summary)
                exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
                expected = attend(*exact, m.double())
                torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
                eager_error = (attend(q, k, v, m).double() - expected).abs().max().item()
                self.assertGreater(eager_error, 1e-3)  # float32's steps of 64 next to -1e9: the case is not vacuous
                if grad:
                    w = torch.randn(out.shape, dtype=torch.float64)
                    got = torch.autograd.grad((out.double() * w).sum(), (q, k, v))
                    want = torch.autograd.grad((expected * w).sum(), exact)
                    for g, e in zip(got, want):
                        torch.testing.assert_close(g.double(), e, atol=1e-4, rtol=1e-4)

    def test_a_float_mask_input_cast_into_the_softmax_is_not_rebased(self):
        """Scores cast on their way into the softmax (softmax's `dtype=`, or a cast after the mask): the program in
        float64 rounds the masked sum to float32 there, where next to -1e9 the scores vanish (a uniform row), so the
        op adds the mask as written, which float32 rounds the same way."""
        def cast_softmax(q, k, v, m):
            return F.softmax(q @ k.mT * 0.25 + m, dim=-1, dtype=torch.float32).to(v.dtype) @ v

        def cast_then_softmax(q, k, v, m):
            return (q @ k.mT * 0.25 + m).float().softmax(-1).to(q.dtype) @ v

        q, k, v = inputs()
        m = torch.randn(1, 1, 6, 6).masked_fill(torch.rand(1, 1, 6, 6) < 0.3, -1e9)
        m[..., 0, :] = -1e9
        for fn in (cast_softmax, cast_then_softmax):
            with self.subTest(fn.__name__):
                rec, out = compile_and_record(fn, q, k, v, m)
                self.assertEqual(rec.count(), 1)
                self.assertNotIn("rebased", rec.summary)
                expected = fn(q.double(), k.double(), v.double(), m.double())
                torch.testing.assert_close(out.double(), expected.double(), atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(out[:, :, 0], v.mean(2).expand_as(out[:, :, 0]), atol=1e-5, rtol=1e-5)

    def test_a_float_mask_input_under_a_sink_is_not_rebased(self):
        """Under an attention sink the op's lse meets the sink's logit, so the mask input goes to the op as it is: a
        row the mask adds -1e9 to on every key gives the sink the whole softmax (out 0), as float64 eager does."""
        sinks = torch.randn(4, dtype=torch.float64)

        def with_sinks(q, k, v, m):
            s = q @ k.mT * 0.25 + m
            c = torch.cat([s, sinks.to(s.dtype).reshape(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], -1)], dim=-1)
            c = c - c.max(dim=-1, keepdim=True).values
            return F.softmax(c, dim=-1)[..., :-1] @ v

        q, k, v = inputs()
        m = torch.randn(1, 1, 6, 6).masked_fill(torch.rand(1, 1, 6, 6) < 0.3, -1e9)
        m[..., 0, :] = -1e9
        rec, out = compile_and_record(with_sinks, q, k, v, m)
        self.assertEqual(rec.count(), 1)
        self.assertIn("key_mask=additive mask input", rec.records[0].detail)
        self.assertNotIn("rebased", rec.summary)
        expected = with_sinks(q.double(), k.double(), v.double(), m.double())
        torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
        self.assertEqual(out[:, :, 0].abs().max().item(), 0.0)

    def test_a_float_mask_inputs_rows_without_keys_are_nan_as_in_eager(self):
        """A float mask input that is -inf on every key of a row: eager's softmax gives that row NaN (0 / 0), the op
        and SDPA zeros, so the rewrite multiplies their output by `nan_where_no_key` of the mask. A row mixing -inf and
        finfo.min averages V over its finfo.min keys only, in eager and on each path. Prefill (the op, per query row,
        forward and gradients), decode step (the op, one row) and a [Sq, Sk] mask (SDPA); against float64 eager."""
        def attend(q, k, v, m):
            return torch.softmax(q @ k.mT * 0.25 + m, -1) @ v

        low, inf = torch.finfo(torch.float32).min, float("-inf")
        per_query = torch.randn(1, 1, 5, 7) * 3
        per_query[..., 0, :] = inf  # sees no key
        per_query[..., 1, :] = torch.tensor([inf, low, inf, low, low, inf, inf])  # the mean of V over keys 1, 3, 4
        per_query[..., 2, 4:] = inf
        one_row = torch.randn(3, 1, 1, 7) * 3
        one_row[1] = inf
        one_row[2, ..., :3] = inf
        one_row[2, ..., 3:] = low
        cases = [("prefill", (3, 4, 5, 16), per_query), ("decode", (3, 4, 1, 16), one_row),
                 ("sdpa", (3, 4, 5, 16), per_query[0, 0])]
        for name, q_shape, m in cases:
            for training in (False, True):
                if training and name != "prefill":
                    continue
                with self.subTest(name, training=training):
                    q = torch.randn(q_shape, requires_grad=training)
                    k, v = (torch.randn(3, 4, 7, 16, requires_grad=training) for _ in range(2))
                    rec, out = compile_and_record(attend, q, k, v, m)
                    self.assertEqual([r.rewritten for r in rec.records], [True])
                    inputs64 = [t.detach().double().requires_grad_(training) for t in (q, k, v)]
                    want = attend(*inputs64, m.double())
                    self.assertTrue(want.isnan().any())
                    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5, equal_nan=True)
                    if training:
                        got_grads = torch.autograd.grad(out.sum(), (q, k, v))
                        want_grads = torch.autograd.grad(want.sum(), inputs64)
                        for got, expected in zip(got_grads, want_grads):
                            torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5, equal_nan=True)

    def test_a_float_mask_input_is_kept_with_a_softcap_or_in_training(self):
        def capped(q, k, v, m):
            s = torch.tanh(q @ k.mT * 0.25 / 30.0) * 30.0
            return torch.softmax(s + m, -1) @ v

        def plain(q, k, v, m):
            return torch.softmax(q @ k.mT * 0.25 + m, -1) @ v

        q, k, v = inputs()
        rec, out = compile_and_record(capped, q, k, v, torch.randn(6, 6))
        self.assertEqual(rec.count(), 0)
        self.assertExpectedInline("\n".join(rec.reasons), """mask not recognized: the mask is the graph input l_m_; its values are unknown when compiling (only a boolean [B, 1, Sq or 1, Sk] input is read, as a key mask); with a softcap, which SDPA has not""")
        rec, out = compile_and_record(plain, q.requires_grad_(), k, v, torch.randn(6, 6))
        self.assertEqual(rec.count(), 0)
        self.assertExpectedInline("\n".join(rec.reasons), """mask not recognized: the mask is the graph input l_m_; its values are unknown when compiling (only a boolean [B, 1, Sq or 1, Sk] input is read, as a key mask); in training it is kept as written""")

    def test_attention_sinks(self):
        """GPT-OSS's sinks: a learned logit a head joins the scores in the softmax (shifted by its row max), its column
        dropped before @ v: the op's out * sigmoid(lse - sink), against float64 eager; a softmax that never reaches an
        @ v (a router) is not attention and leaves no record."""
        sinks = torch.randn(4, dtype=torch.float64)

        def with_sinks(q, k, v):
            s = q @ k.mT * 0.25
            c = torch.cat([s, sinks.to(s.dtype).reshape(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], -1)], dim=-1)
            c = c - c.max(dim=-1, keepdim=True).values
            return F.dropout(F.softmax(c, dim=-1, dtype=c.dtype)[..., :-1], p=0.0, training=False).to(v.dtype) @ v

        def router(q, k, v):
            return torch.softmax(q.sum(-1), -1).topk(2).values

        q, k, v = inputs()
        rec, out = compile_and_record(with_sinks, q, k, v)
        self.assertExpectedInline(rec.summary, """\
fa4_attention: (f32[2, 4, 6, 16], f32[2, 4, 6]) = fa4.attention(q, k, v, scale=0.25)
attention_out: f32[2, 4, 6, 16] = getitem(fa4_attention, 0)
attention_lse: f32[2, 4, 6] = getitem(fa4_attention, 1)
sink_logits: f32[2, 4, 6, 1] = .float(.expand(.reshape(.to(sinks, float32), 1, -1, 1, 1), 2, -1, 6, -1))
squeeze: f32[2, 4, 6] = .squeeze(sink_logits, -1)
sub: f32[2, 4, 6] = sub(attention_lse, squeeze)
sink_weight: f32[2, 4, 6] = sigmoid(sub)
unsqueeze: f32[2, 4, 6, 1] = .unsqueeze(sink_weight, -1)
mul: f32[2, 4, 6, 16] = mul(attention_out, unsqueeze)
attention_out_sink: f32[2, 4, 6, 16] = .to(mul, float32)
attention_out_contiguous: f32[2, 4, 6, 16] = .contiguous(attention_out_sink)""")
        self.assertIn("attention sink: out * sigmoid(lse - sink)", rec.records[0].detail)
        torch.testing.assert_close(out.double(), with_sinks(q.double(), k.double(), v.double()), atol=1e-5, rtol=1e-5)
        rec, _ = compile_and_record(router, q, k, v)
        self.assertEqual((rec.count(), rec.reasons), (0, []))

    def test_attention_sinks_in_training_and_over_padding(self):
        """The sink's gradient, q's, k's and v's against float64 eager, through a finfo.min padding mask that hides
        every key from some rows (eager gives them 0: the sink takes the whole softmax) and a causal band."""
        def gpt_oss(q, k, v, sinks, attention_mask):
            s = torch.matmul(q, k.transpose(2, 3)) * 0.25 + padded_causal_bias(q, attention_mask)
            c = torch.cat([s, sinks.reshape(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[-2], -1)], dim=-1)
            c = c - c.max(dim=-1, keepdim=True).values
            return torch.matmul(F.softmax(c, dim=-1, dtype=c.dtype)[..., :-1], v)

        rec = assert_trains_as_float64(gpt_oss)
        self.assertIn("key_mask=padding mask", rec.records[0].detail)

    def test_a_sink_a_query_cast_to_float(self):
        """Inkling 2's sinks: a logit a query projected from the hidden states (from q here, so its gradient reaches q
        twice), the scores and sinks joined, cast to float, no row-max shift: the same op call and sink weight, against
        float64 eager, gradients too."""
        def inkling2(q, k, v, sinks, attention_mask):
            s = torch.matmul(q, k.transpose(2, 3)) * 0.25 + padded_causal_bias(q, attention_mask)
            per_query = q.sum(-1, keepdim=True) * 0.5 + sinks.view(1, -1, 1, 1)
            c = torch.cat([s, per_query], dim=-1)
            c = c.float() if c.dtype != torch.float64 else c  # the float64 reference stays float64
            return torch.matmul(F.softmax(c, dim=-1)[..., :-1].to(q.dtype), v)

        rec = assert_trains_as_float64(inkling2)
        self.assertIn("attention sink: out * sigmoid(lse - sink)", rec.records[0].detail)

    def test_a_row_max_shift_without_a_sink(self):
        """MiMo-V2-Flash's layers without sinks shift the scores by their row max before the softmax (which changes
        none of its values): rewritten, through a finfo.min padding mask, against float64 eager, gradients too."""
        def shifted(q, k, v, attention_mask):
            s = torch.matmul(q, k.transpose(2, 3)) * 0.25 + padded_causal_bias(q, attention_mask)
            s = s - s.max(dim=-1, keepdim=True).values
            return torch.matmul(F.softmax(s, dim=-1, dtype=s.dtype), v)

        assert_trains_as_float64(shifted, sinks=False)

    def test_attention_sinks_as_a_scale_after_the_output(self):
        """Granite SWA's sinks: eager's out scaled by sigmoid(logsumexp(scores) - sink) in float32 (GPT-OSS's sink
        written after @ v), a logit a head broadcast over the rows; the same op call and sink weight. Training through
        a finfo.min padding mask and a causal band: out and every gradient (the sink's too) against float64 eager,
        rows that see no key 0."""
        def granite(q, k, v, sinks, attention_mask):
            s = torch.matmul(q, k.transpose(2, 3)) * 0.25 + padded_causal_bias(q, attention_mask)
            lse = torch.logsumexp(s, dim=-1)
            scale = (lse - sinks.view(1, -1, 1)).to(torch.float32).sigmoid()
            # float32 as written for bf16 models; the float64 reference's finfo.min would be -inf there (NaN rows)
            p = F.softmax(s, dim=-1, dtype=torch.promote_types(s.dtype, torch.float32)).to(q.dtype)
            out = torch.matmul(F.dropout(p, p=0.0, training=False), v)
            return out * scale.unsqueeze(-1).to(out.dtype)

        rec, out = compile_and_record(granite, *inputs(), torch.randn(4), LEFT_PADDING)
        self.assertExpectedInline(rec.summary, """\
narrow: b8[2, 6] = narrow(.bool(attention_mask), 1, 0, 6)
key_mask: b8[2, 6] = fa4.key_mask(narrow)
fa4_attention: (f32[2, 4, 6, 16], f32[2, 4, 6]) = fa4.attention(q, k, v, None, key_mask, scale=0.25, causal=True)
attention_out: f32[2, 4, 6, 16] = getitem(fa4_attention, 0)
attention_lse: f32[2, 4, 6] = getitem(fa4_attention, 1)
sink_logits: f32[1, 4, 1] = .float(.view(sinks, 1, -1, 1))
sub: f32[2, 4, 6] = sub(attention_lse, sink_logits)
sink_weight: f32[2, 4, 6] = sigmoid(sub)
unsqueeze: f32[2, 4, 6, 1] = .unsqueeze(sink_weight, -1)
mul: f32[2, 4, 6, 16] = mul(attention_out, unsqueeze)
attention_out_sink: f32[2, 4, 6, 16] = .to(mul, float32)
attention_out_contiguous: f32[2, 4, 6, 16] = .contiguous(attention_out_sink)""")
        self.assertIn("attention sink: out * sigmoid(lse - sink)", rec.records[0].detail)
        assert_trains_as_float64(granite)

    def test_a_scale_that_is_not_the_sinks_keeps_the_attention(self):
        """The scale's logsumexp over the queries (dim -2), the scale also read elsewhere, rounded to integers or
        unsqueezed twice: kept as written, eager's output."""
        sinks = torch.randn(4)

        def over_queries(q, k, v):
            s = q @ k.mT * 0.25
            scale = (torch.logsumexp(s, dim=-2) - sinks.view(1, -1, 1)).sigmoid()
            return (torch.softmax(s, -1) @ v) * scale.unsqueeze(-1)

        def read_twice(q, k, v):
            s = q @ k.mT * 0.25
            scale = (torch.logsumexp(s, dim=-1) - sinks.view(1, -1, 1)).sigmoid().unsqueeze(-1)
            return (torch.softmax(s, -1) @ v) * scale + scale

        def rounded(q, k, v):
            s = q @ k.mT * 0.25
            scale = (torch.logsumexp(s, dim=-1) - sinks.view(1, -1, 1)).sigmoid().unsqueeze(-1).to(torch.int64)
            return (torch.softmax(s, -1) @ v) * scale

        def unsqueezed_twice(q, k, v):
            s = q @ k.mT * 0.25
            scale = (torch.logsumexp(s, dim=-1) - sinks.view(1, -1, 1)).sigmoid().unsqueeze(-1).float().unsqueeze(0)
            return (torch.softmax(s, -1) @ v) * scale

        q, k, v = inputs()
        for fn in (over_queries, read_twice, rounded, unsqueezed_twice):
            rec, out = compile_and_record(fn, q, k, v)
            self.assertEqual(rec.count(), 0)
            self.assertEqual(rec.reasons, ["an intermediate (s) is also used outside the attention"])
            torch.testing.assert_close(out, fn(q, k, v))

    def test_attention_sink_kept_where_its_column_is_not_the_last(self):
        sinks = torch.randn(4)

        def first(q, k, v):
            s = q @ k.mT * 0.25
            c = torch.cat([sinks.reshape(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[2], -1), s], dim=-1)
            return torch.softmax(c, -1)[..., 1:] @ v

        q, k, v = inputs()
        rec, out = compile_and_record(first, q, k, v)
        self.assertEqual(rec.count(), 0)
        self.assertExpectedInline(
            "\n".join(rec.reasons), """getitem (getitem) between the softmax and its @ v is not understood""")
        torch.testing.assert_close(out, first(q, k, v))

    def test_gpt_oss_reference_einsums_in_place_steps_and_sinks(self):
        """The gpt-oss repository's torch reference attention: einsums over [tokens, heads, q_mult, d] (K/V expanded
        over q_mult), the scale and the causal mask applied in place (`*=`, `+=`), a sink a head: one op call over
        [heads, q_mult, tokens, d] (einsum.py), against float64."""
        def sdpa(Q, K, V, S, sm_scale=0.25):
            n_tokens, n_heads, q_mult, d_head = Q.shape
            K = K[:, :, None, :].expand(-1, -1, q_mult, -1)
            V = V[:, :, None, :].expand(-1, -1, q_mult, -1)
            S = S.reshape(n_heads, q_mult, 1, 1).expand(-1, -1, n_tokens, -1)
            mask = torch.triu(Q.new_full((n_tokens, n_tokens), -float("inf")), diagonal=1)
            QK = torch.einsum("qhmd,khmd->hmqk", Q, K)
            QK *= sm_scale
            QK += mask[None, None, :, :]
            QK = torch.cat([QK, S], dim=-1)
            W = torch.softmax(QK, dim=-1)[..., :-1]
            attn = torch.einsum("hmqk,khmd->qhmd", W, V)
            return attn.reshape(n_tokens, -1)

        args = (torch.randn(7, 2, 4, 16), torch.randn(7, 2, 16), torch.randn(7, 2, 16), torch.randn(8))
        rec, out = compile_and_record(sdpa, *args)
        self.assertExpectedInline("\n".join(r.detail for r in rec.records), """fa4.attention(q[2x4x7x16], k[2x4x7x16], v[2x4x7x16], scale=0.25, causal=True); attention sink: out * sigmoid(lse - sink)""")
        torch.testing.assert_close(out.double(), sdpa(*(t.double() for t in args)), atol=1e-5, rtol=1e-5)

    def test_einsum_attention_with_a_reshaped_padding_mask(self):
        """lucidrains-style code: einsums, a [B, Sk] padding mask reshaped to [B, 1, 1, Sk] (what einops'
        `rearrange(mask, "b j -> b 1 1 j")` traces to), -finfo.max fills, a causal triu: the op with the padding mask
        as its key_mask, output and gradients against eager; a row that sees no key gets eager's mean of V (both
        fills write the one value, so such a row's scores are all equal, as after one step)."""
        def attend(q, k, v, mask):
            sim = torch.einsum("b h i d, b h j d -> b h i j", q * 0.25, k)
            sim = sim.masked_fill(~mask.reshape(mask.shape[0], 1, 1, mask.shape[1]), -torch.finfo(sim.dtype).max)
            i, j = sim.shape[-2:]
            sim = sim.masked_fill(torch.ones((i, j), dtype=torch.bool).triu(j - i + 1), -torch.finfo(sim.dtype).max)
            return torch.einsum("b h i j, b h j d -> b h i d", sim.softmax(dim=-1), v)

        q, k, v = (t.requires_grad_() for t in inputs())
        mask = left_padded_keys()
        rec, out = compile_and_record(attend, q, k, v, mask)
        self.assertEqual(rec.count(), 1, rec.reasons)
        self.assertIn("key_mask=padding mask, rows that see no key: mean of V", rec.records[0].detail)
        assert_output_and_gradients_match(out, attend(q, k, v, mask), (q, k, v))

    def test_dropout_in_training_becomes_sdpa_with_it(self):
        """nanoGPT's attention without flash, training: SDPA with its dropout_p and is_causal (the op has no dropout).
        The graph runs SDPA eagerly here, so a seed gives eager SDPA's random mask: output and gradients equal."""
        m = upstream.CausalSelfAttention().train()
        x = torch.randn(2, 10, 32, requires_grad=True)
        torch.manual_seed(3)
        rec, out = compile_and_record(m, x)
        self.assertEqual(rec.count(), 0)
        self.assertExpectedInline("\n".join(r.detail for r in rec.records), """\
F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25, dropout_p=0.1): dropout p=0.1 in training, which SDPA's kernels take and the op does not""")

        flash = upstream.CausalSelfAttention(flash=True).train()  # nanoGPT's SDPA path, the same weights
        flash.load_state_dict(m.state_dict(), strict=False)
        torch.manual_seed(3)
        assert_output_and_gradients_match(out, flash(x), (x,))

    def test_dropout_in_training_with_a_padding_mask_stays_as_written(self):
        def attend(q, k, v, keys):
            s = (q @ k.mT * 0.25).masked_fill(~keys[:, None, None, :], float("-inf"))
            return F.dropout(s.softmax(-1), p=0.1, training=True) @ v

        q, k, v = (t.requires_grad_() for t in inputs())
        rec, _ = compile_and_record(attend, q, k, v, left_padded_keys())
        self.assertEqual(len(rec.records), 1)
        self.assertExpectedInline("\n".join(rec.reasons), """\
dropout p=0.1 in training with a mask beyond a causal band: SDPA takes the dropout, not that""")

    def test_fallback_weights_returned(self):
        def fn(q, k, v):
            w = torch.softmax(q @ k.mT * 0.25, -1)
            return w @ v, w

        rec, _ = compile_and_record(fn, *inputs())
        self.assertEqual(rec.count(), 0)
        self.assertExpectedInline("\n".join(rec.reasons), """the attention weights are also used outside the attention (output_attentions?)""")

    def test_fallback_mask_hides_diagonal(self):
        def fn(q, k, v):
            n = q.shape[-2]
            return torch.softmax((q @ k.mT).masked_fill(torch.ones(n, n).tril(-1) == 0, float("-inf")), -1) @ v

        rec, _ = compile_and_record(fn, *inputs())
        self.assertEqual(rec.count(), 0)
        self.assertExpectedInline("\n".join(rec.reasons), """mask not recognized: the visible band -inf <= j - i <= -1 does not contain the diagonal""")

    def test_fallback_small_fill_value(self):
        def fn(q, k, v):
            n = q.shape[-2]
            return torch.softmax((q @ k.mT).masked_fill(torch.ones(n, n).tril() == 0, -100.0), -1) @ v

        rec, _ = compile_and_record(fn, *inputs())
        self.assertEqual(rec.count(), 0)
        self.assertExpectedInline("\n".join(rec.reasons), """mask not recognized: the mask fill value -100.0 is above -10000: it does not hide keys""")

    def test_finite_fills_that_hide_keys(self):
        """Masking steps that overwrite hidden scores with a finite fill of at most `HIDING_FILL`: the Annotated
        Transformer's masked_fill(mask == 0, -1e9) over a padding mask, whose all-padding sequence's rows are the mean
        of V (eager's softmax of a row of nothing but the fill is uniform), and old GPT-2 code's where(causal, s,
        -1e4). The op, output and gradients against eager in float64."""
        def annotated(q, k, v, attention_mask):
            s = q @ k.mT / math.sqrt(q.shape[-1])
            return torch.softmax(s.masked_fill(attention_mask[:, None, None, :] == 0, -1e9), -1) @ v

        def gpt2(q, k, v, attention_mask):
            n = q.shape[-2]
            s = q @ k.mT / math.sqrt(q.shape[-1])
            return torch.softmax(torch.where(torch.ones(n, n).tril().bool(), s, torch.tensor(-1e4)), -1) @ v

        attention_mask = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]])
        for fn in (annotated, gpt2):
            q, k, v = (t.requires_grad_() for t in inputs())
            rec, out = compile_and_record(fn, q, k, v, attention_mask)
            self.assertEqual(rec.count(), 1)
            leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
            want = fn(*leaves, attention_mask)
            torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
            weights = torch.randn(out.shape, dtype=torch.float64)
            got_grads = torch.autograd.grad((out.double() * weights).sum(), (q, k, v))
            for got, expected in zip(got_grads, torch.autograd.grad((want * weights).sum(), leaves)):
                torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
        self.assertIn("causal=True", rec.records[0].detail)

    def test_fallback_head_dim(self):
        rec, _ = compile_and_record(lambda q, k, v: torch.softmax(q @ k.mT, -1) @ v, *inputs(d=20))
        self.assertEqual(rec.reasons, ["head_dim 20 is not a multiple of 8 in 8..256"])

    def test_softmax_elsewhere_is_no_candidate(self):
        rec, _ = compile_and_record(lambda x, w: torch.softmax(x @ w, -1).sum(), torch.randn(3, 8), torch.randn(8, 8))
        self.assertEqual(rec.records, [])


@pytest.mark.parametrize("equation, a, b, expected", [
    ("bhid,bhjd->bhij", 4, 4, ([0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3])),
    ("b h i d, b h j d -> b h i j", 4, 4, ([0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3])),
    ("qhmd,khmd->hmqk", 4, 4, ([1, 2, 0, 3], [1, 2, 0, 3], [0, 1, 2, 3])),
    ("hmqk,khmd->qhmd", 4, 4, ([0, 1, 2, 3], [1, 2, 3, 0], [2, 0, 1, 3])),
    ("bij,bjk->bik", 3, 3, ([0, 1, 2], [0, 2, 1], [0, 1, 2])),
    ("...id,...jd->...ij", 4, 4, None),  # an ellipsis
    ("i,j->ij", 1, 1, None),  # an outer product: nothing contracted
    ("bhid,bhjd->bij", 4, 4, None),  # a summed-out batch index
    ("bhii,bhjd->bhij", 4, 4, None),  # a repeated index
    ("bid,bjd,bkd->bijk", 3, 3, None),  # three operands
    ("bhid,bhjd->bhij", 3, 4, None),  # the operand's rank differs from the equation's
])
def test_einsum_plans(equation, a, b, expected):
    """`einsum.plan`: the permutations that make a matmul-shaped einsum a matmul, None for any other einsum."""
    from fa4_inductor.lowering import einsum

    assert einsum.plan(equation, a, b) == expected


class LastRowsOfACausalBuffer(torch.nn.Module):
    """GPT-Neo's masking: a causal buffer of `rows` x `cols` sliced at the last queries' rows, `[Sk - Sq:Sk, :Sk]`."""

    def __init__(self, rows: int, cols: int):
        super().__init__()
        self.register_buffer("bias", torch.ones(rows, cols, dtype=torch.bool).tril()[None, None], persistent=False)

    def forward(self, q, k, v):
        s = q @ k.transpose(-1, -2) * 0.25
        sq, sk = q.shape[-2], k.shape[-2]
        s = torch.where(self.bias[:, :, sk - sq:sk, :sk], s, torch.finfo(s.dtype).min)
        return s.softmax(-1) @ v


def test_a_buffer_sliced_from_a_symbolic_row():
    """A first call compiles the slice at fixed rows (7:9 of the buffer, a band off the diagonal: FA4's bottom-right
    causal band over 9 keys); the next ones under dynamic shapes: as many queries as keys (a prefill, Sk - Sq guarded
    to be 0), then more keys (a decode step: the buffer's band at query positions Sk - Sq + i, Sk - Sq symbolic). All
    on the op, with eager's output."""
    module = LastRowsOfACausalBuffer(16, 16)
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(module, backend=recorder)
    for sq, sk in ((2, 9), (5, 5), (3, 11), (1, 12), (6, 6)):
        q, k, v = torch.randn(2, 4, sq, 16), torch.randn(2, 4, sk, 16), torch.randn(2, 4, sk, 16)
        torch.testing.assert_close(compiled(q, k, v), module(q, k, v), atol=1e-5, rtol=1e-5)
    assert len(recorder.graphs) >= 2 and recorder.count() == len(recorder.graphs), recorder.records  # one query:
    # a graph of its own (Dynamo specializes sizes 0 and 1)
