"""The mask algebra of `lowering/masks.py`, tested directly: bands, what mask subgraphs are read as, the visible
keys of each use, and the op flags a band becomes.

Each mask subgraph is captured by Dynamo (the graphs the backend sees) and read by `masks.evaluate`; the band
it is read as is then compared, element by element, with the boolean mask eager computes. The property tests
draw sizes, offsets and windows at random (hypothesis); `band_args` is checked against what `fa4::attention`
itself shows each query.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fa4_inductor.lowering import masks, module_buffers
from fa4_inductor.lowering.masks import ALL, INF, Band, KeyMask, MaskNotUnderstood, Shift, TwoValued

PROFILE = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def captured(fn, *args):
    """The graph Dynamo captures for fn(*args) (one graph, no graph breaks), its mask output node (fn's result),
    and the module buffers masks.py may read by value."""
    found = []

    def backend(gm, example_inputs):
        found.append((gm, module_buffers(gm, example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    ((gm, constants),) = found
    (out,) = gm.graph.find_nodes(op="output")
    result = out.args[0]
    return (result[0] if isinstance(result, (tuple, list)) else result), constants


def read(fn, *args) -> TwoValued:
    node, constants = captured(fn, *args)
    return masks.evaluate(node, constants)


def band_mask(band: Band, sq: int, sk: int, offset: int = 0) -> torch.Tensor:
    """[Sq, Sk] boolean: lo <= j - i - offset <= hi (offset Sk - Sq: bottom-right alignment)."""
    d = torch.arange(sk)[None, :] - torch.arange(sq)[:, None] - offset
    return (d >= band.lo) & (d <= band.hi) if not band.empty else torch.zeros(sq, sk, dtype=torch.bool)


def values_of(tv: TwoValued, sq: int, sk: int) -> torch.Tensor:
    """The [Sq, Sk] tensor a two-valued band stands for: inside in the band, outside elsewhere."""
    return torch.where(band_mask(tv.band, sq, sk), torch.tensor(float(tv.inside)), torch.tensor(float(tv.outside)))


Q = torch.zeros(1)  # fn's tensor argument: sizes below are Python ints, burnt into the graph

# ------------------------------------------------------------------------------------------------------ Band


def test_band_intersection_takes_the_tighter_bounds():
    assert Band(-3, 2) & Band(-1, 5) == Band(-1, 2)
    assert Band(-INF, 0) & ALL == Band(-INF, 0)
    assert (Band(1, 3) & Band(-2, 0)).empty


def test_band_unbounded_drops_its_shift_and_bounded_keeps_it():
    shift = Shift(None, top=1)
    assert Band(shift=shift).shift is None and not ALL.bounded
    assert Band(-INF, 0, shift).shift == shift and Band(-INF, 0).bounded


def test_band_intersection_refuses_mixed_positions_and_two_key_masks():
    shifted = Band(-INF, 0, Shift(None, top=1))
    with pytest.raises(MaskNotUnderstood, match="run-time query positions combined with one at fixed positions"):
        shifted & Band(-2, INF)
    assert (shifted & ALL) == shifted  # an unbounded band has no positions to disagree with
    graph = torch.fx.Graph()
    a, b = KeyMask(graph.placeholder("a")), KeyMask(graph.placeholder("b"))
    assert (Band(keys=a) & Band(-INF, 0)) == Band(-INF, 0, keys=a)
    assert (Band(keys=a) & Band(keys=a)).keys == a
    with pytest.raises(MaskNotUnderstood, match="two different key-padding masks"):
        Band(keys=a) & Band(keys=b)


def test_band_complement():
    assert Band(-INF, 0).complement() == Band(1, INF)
    assert Band(-2, INF).complement() == Band(-INF, -3)
    assert ALL.complement().empty and Band(1, 0).complement() == ALL
    with pytest.raises(MaskNotUnderstood, match="is two bands"):
        Band(-2, 0).complement()
    key_mask = KeyMask(torch.fx.Graph().placeholder("m"))
    with pytest.raises(MaskNotUnderstood, match="complement of the key-padding mask m"):
        Band(keys=key_mask).complement()


def test_two_valued_where():
    tv = TwoValued(Band(-INF, 0), 1.0, 0.0)
    assert tv.where(bool) == Band(-INF, 0)
    assert tv.where(lambda v: v == 0) == Band(1, INF)
    assert tv.where(lambda v: True) == ALL and tv.where(lambda v: False).empty
    assert TwoValued(ALL, 3, 3).uniform and TwoValued(Band(-1, 1), 2, 2).uniform
    assert TwoValued(Band(-1, 1), True, False).boolean and not tv.boolean


# -------------------------------------------------------------------------------------------------- band_args


@pytest.mark.parametrize("band, flags", [
    (ALL, {}),
    (Band(-INF, 0), {"causal": True}),
    (Band(-3, 0), {"causal": True, "window_left": 3}),
    (Band(-2, 4), {"window_left": 2, "window_right": 4}),
    (Band(0, INF), {"window_left": 0}),
    (Band(-INF, 1), {"window_right": 1}),
])
def test_band_args(band, flags):
    assert masks.band_args(band) == flags


@pytest.mark.parametrize("band, reason", [(Band(1, 0), "hides every key"),
                                          (Band(-INF, -1), "does not contain the diagonal"),
                                          (Band(1, 3), "does not contain the diagonal")])
def test_band_args_refuses(band, reason):
    with pytest.raises(MaskNotUnderstood, match=reason):
        masks.band_args(band)


def test_broadcasts_last_two_dims():
    assert masks.broadcasts_last_two_dims((1, 1, 5, 7), (2, 4, 5, 7))
    assert masks.broadcasts_last_two_dims((2, 1, 1, 7), (2, 4, 5, 7))
    assert masks.broadcasts_last_two_dims((5, 1), (2, 4, 5, 7))
    assert not masks.broadcasts_last_two_dims((7,), (2, 4, 5, 7))
    assert not masks.broadcasts_last_two_dims((5, 6), (2, 4, 5, 7))


# ----------------------------------------------------------------------------------- reading mask subgraphs


def test_reads_tril_and_triu():
    tv = read(lambda x: torch.ones(6, 6).tril(), Q)
    assert (tv.band, tv.inside, tv.outside) == (Band(-INF, 0), 1.0, 0.0)
    tv = read(lambda x: torch.ones(6, 6, dtype=torch.bool).tril().triu(-2), Q)
    assert tv.where(bool) == Band(-2, 0)
    tv = read(lambda x: torch.full((5, 5), float("-inf")).triu(1), Q)
    assert (tv.band, tv.inside, tv.outside) == (Band(1, INF), -math.inf, 0.0)


def test_reads_arange_comparisons_with_offsets():
    def fn(x):
        q_idx, kv_idx = torch.arange(4) + 3, torch.arange(7)
        return (kv_idx[None, :] <= q_idx[:, None]) & (kv_idx[None, :] > q_idx[:, None] - 2)

    assert read(fn, Q).where(bool) == Band(2, 3)


def test_reads_nanogpt_bias_buffer_by_value():
    class Biased(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("bias", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))

        def forward(self, x):
            return self.bias[:, :, :5, :5] == 0

    assert read(Biased(), Q).where(lambda m: not m) == Band(-INF, 0)


def test_reads_a_run_time_offset_as_a_shift():
    def fn(offset):
        q_idx = torch.arange(2) + offset
        return torch.arange(9)[None, None, None, :] <= q_idx[None, None, :, None]

    node, constants = captured(fn, torch.tensor(3))
    band = masks.evaluate(node, constants).where(bool)
    assert (band.lo, band.hi) == (-INF, 0)
    assert band.shift is not None and band.shift.node.op == "placeholder" and band.shift.minus is None


def test_reads_hf_padding_lookup_and_boolean_plane_input_as_key_masks():
    def hf(attention_mask):
        keep = attention_mask.to(torch.bool)
        return keep[torch.arange(3)[:, None, None, None], torch.arange(5)[None, None, None, :]]

    node, constants = captured(hf, torch.ones(3, 5, dtype=torch.long))
    band = masks.evaluate(node, constants).where(bool)
    assert not band.bounded and band.keys is not None and band.keys.start is None and not band.keys.plane

    node, constants = captured(lambda m: m, torch.ones(3, 1, 1, 5, dtype=torch.bool))
    band = masks.evaluate(node, constants).where(bool)
    assert band.keys is not None and band.keys.plane and band.keys.node is node


@pytest.mark.parametrize("fn, reason", [
    (lambda m: m == 1, "the mask is the graph input"),
    (lambda x: (torch.ones(4, 4).tril() == 0) | (x > 0), "not understood"),
    (lambda x: torch.ones(4, 4).tril(int(x.shape[0]) - 3) * torch.rand(4, 4), "built by rand"),
    (lambda x: torch.ones(4, 4).tril() * x, "the mask is the graph input"),
    (lambda x: torch.ones(4, 4).tril() * (torch.ones(4, 4).triu() * 2), "neither a boolean selecting"),
    (lambda x: torch.arange(4)[:, None] + torch.arange(4)[None, :] > x, "compares"),
    (lambda x: torch.ones(4, 4).tril() + torch.full((4, 4), -INF).triu(1), "add .* of masks that are not 0 and -inf"),
])
def test_declines_with_the_reason(fn, reason):
    node, constants = captured(fn, torch.zeros(4, 4))
    with pytest.raises(MaskNotUnderstood, match=reason):
        masks.evaluate(node, constants)


# ------------------------------------------------------------------------------------- transformers 4 spellings


class _SlicedRows(torch.nn.Module):
    """GPT-2's causal buffer in transformers 4, sliced to its last queries' rows (`bias[:, :, Sk - Sq:Sk, :Sk]`)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(8, 8, dtype=torch.bool)).view(1, 1, 8, 8))

    def forward(self, x):
        return self.bias[:, :, 5:8, :8]


def _in_place_offset(x):  # sdpa_mask: kv_arange += kv_offset
    kv = torch.arange(7)
    kv += 2
    return kv[None, :] <= (torch.arange(3) + 4)[:, None]


def _finfo_triangle_times_positions(x):  # _prepare_4d_causal_attention_mask_with_cache_position
    m = torch.full((3, 7), torch.finfo(torch.float32).min).triu(1)
    m *= torch.arange(7) > (torch.arange(3) + 4).reshape(-1, 1)
    return m


@pytest.mark.parametrize("fn", [_in_place_offset, _finfo_triangle_times_positions, _SlicedRows()],
                         ids=["in-place-offset", "finfo-triangle-times-positions", "sliced-buffer-rows"])
def test_reads_transformers_4_spellings_as_eager_computes_them(fn):
    expected = fn(Q)
    tv = read(fn, Q)
    torch.testing.assert_close(values_of(tv, *expected.shape[-2:]), expected.reshape(expected.shape[-2:]).float())


def test_reads_transformers_4_inverted_padding_mask_as_a_key_mask():
    """BERT's mask in transformers 4 (`AttentionMaskConverter._expand_mask`): `1 - mask` filled with finfo.min where
    it is nonzero."""
    def expand_mask(mask):
        expanded = mask[:, None, None, :].expand(2, 1, 3, 5).to(torch.float32)
        inverted = torch.tensor(1.0) - expanded
        return inverted.masked_fill(inverted.to(torch.bool), torch.finfo(torch.float32).min)

    node, constants = captured(expand_mask, torch.ones(2, 5, dtype=torch.long))
    band, hidden = masks.keep_band("additive", node, constants)
    assert not band.bounded and band.keys is not None and hidden == torch.finfo(torch.float32).min


# ------------------------------------------------------------------------------------------------- keep_band


def test_keep_band_of_each_use():
    node, constants = captured(lambda x: torch.ones(4, 4).tril() == 0, Q)
    assert masks.keep_band("masked_fill", node, constants, float("-inf")) == (Band(-INF, 0), -math.inf)
    node, constants = captured(lambda x: torch.ones(4, 4).tril().bool(), Q)
    assert masks.keep_band("where", node, constants, torch.finfo(torch.float32).min)[0] == Band(-INF, 0)
    assert masks.keep_band("bool", node, constants) == (Band(-INF, 0), None)
    node, constants = captured(lambda x: torch.zeros(4, 4).masked_fill(torch.ones(4, 4).tril() == 0, float("-inf")), Q)
    assert masks.keep_band("additive", node, constants) == (Band(-INF, 0), -math.inf)
    with pytest.raises(MaskNotUnderstood, match="fill value -100.0 is above -10000: it does not hide keys"):
        masks.keep_band("masked_fill", node, constants, -100.0)
    node, constants = captured(lambda x: torch.ones(4, 4).tril() == 0, Q)
    assert masks.keep_band("masked_fill", node, constants, -1e9) == (Band(-INF, 0), -1e9)
    node, constants = captured(lambda x: torch.ones(4, 4).tril() * 0.5, Q)
    with pytest.raises(MaskNotUnderstood, match="the additive mask has the value 0.5"):
        masks.keep_band("additive", node, constants)


# ------------------------------------------------------------------------------------------------- properties

sizes = st.integers(1, 7)
diagonals = st.integers(-8, 8)
BOUNDS = st.one_of(st.just(None), st.integers(-6, 6))


@PROFILE
@given(rows=sizes, cols=sizes, lower=BOUNDS, upper=BOUNDS, dtype=st.sampled_from([torch.bool, torch.float32]))
def test_tril_triu_band_equals_eager(rows, cols, lower, upper, dtype):
    """`ones(R, C).tril(upper).triu(lower)` (either step left out) is read as the band eager computes."""
    def fn(x):
        m = torch.ones(rows, cols, dtype=dtype)
        if upper is not None:
            m = m.tril(upper)
        if lower is not None:
            m = m.triu(lower)
        return m

    tv = read(fn, Q)
    torch.testing.assert_close(values_of(tv, rows, cols), fn(Q).float())


@PROFILE
@given(rows=sizes, cols=sizes, upper=st.integers(-4, 4), lower=st.integers(-4, 4))
def test_sum_of_additive_masks_is_the_band_eager_computes(rows, cols, upper, lower):
    """Two 0 / -inf masks added (nn.MultiheadAttention's attn_mask + key_padding_mask): 0 where both are 0."""
    def fn(x):
        return torch.full((rows, cols), -INF).triu(upper + 1) + torch.full((rows, cols), -INF).tril(lower - 1)

    tv = read(fn, Q)
    torch.testing.assert_close(values_of(tv, rows, cols), fn(Q))


OPS = {"le": lambda a, b: a <= b, "lt": lambda a, b: a < b, "ge": lambda a, b: a >= b, "gt": lambda a, b: a > b,
       "eq": lambda a, b: a == b}
comparisons = st.tuples(st.sampled_from(sorted(OPS)), st.integers(-4, 4), st.integers(-4, 4), st.booleans())


@PROFILE
@given(sq=sizes, sk=sizes, terms=st.lists(comparisons, min_size=1, max_size=3), negate=st.booleans())
def test_position_comparisons_are_read_as_the_band_eager_computes(sq, sk, terms, negate):
    """`&` of comparisons `(arange(Sk) + a)[None, :] OP (arange(Sq) + b)[:, None]` (either side first), or the
    negation of one one-sided comparison: read as exactly the boolean mask eager computes."""
    negate = negate and len(terms) == 1 and terms[0][0] != "eq"

    def fn(x):
        kv, q = (torch.arange(sk) + 0)[None, :], (torch.arange(sq) + 0)[:, None]
        mask = None
        for op, a, b, keys_first in terms:
            term = OPS[op](kv + a, q + b) if keys_first else OPS[op](q + b, kv + a)
            mask = term if mask is None else mask & term
        return ~mask if negate else mask

    tv = read(fn, Q)
    event(f"band bounded={tv.where(bool).bounded} empty={tv.where(bool).empty}")
    assert torch.equal(band_mask(tv.where(bool), sq, sk), fn(Q))


@PROFILE
@given(sq=sizes, sk=sizes, op=st.sampled_from(sorted(OPS)), c=st.integers(-3, 4), a=st.integers(-3, 3),
       b=st.integers(-3, 3), keys_minus_queries=st.booleans(), absolute=st.booleans(), constant_first=st.booleans())
def test_position_distances_are_read_as_the_band_eager_computes(sq, sk, op, c, a, b, keys_minus_queries, absolute,
                                                                 constant_first):
    """`(kv + a) - (q + b) OP c` or its reverse, and `abs(...) <= c` / `< c` (HF's bidirectional sliding window,
    ModernBERT: `abs(q_idx - kv_idx) <= w`), the constant on either side: read as exactly the boolean mask eager
    computes; an absolute distance kept outside a band declines."""
    def fn(x):
        kv, q = (torch.arange(sk) + a)[None, :], (torch.arange(sq) + b)[:, None]
        d = kv - q if keys_minus_queries else q - kv
        d = d.abs() if absolute else d
        return OPS[op](c, d) if constant_first else OPS[op](d, c)

    flipped = {"le": "ge", "lt": "gt", "ge": "le", "gt": "lt", "eq": "eq"}[op] if constant_first else op
    if absolute and flipped not in ("le", "lt"):
        with pytest.raises(MaskNotUnderstood, match="outside a band"):
            read(fn, Q)
        return
    assert torch.equal(band_mask(read(fn, Q).where(bool), sq, sk), fn(Q))


bands = st.builds(lambda lo, hi: Band(-INF if lo is None else lo, INF if hi is None else hi), BOUNDS, BOUNDS)


@PROFILE
@given(a=bands, b=bands, sq=sizes, sk=sizes)
def test_intersection_and_complement_laws(a, b, sq, sk):
    """`&` is the elementwise and; `complement`, where it is one band, the elementwise not."""
    assert torch.equal(band_mask(a & b, sq, sk), band_mask(a, sq, sk) & band_mask(b, sq, sk))
    assert (a & b) == (b & a)
    try:
        complement = a.complement()
    except MaskNotUnderstood:
        event("two-sided: no complement band")
        assert a.lo != -INF and a.hi != INF and not a.empty
        return
    assert torch.equal(band_mask(complement, sq, sk), ~band_mask(a, sq, sk))


@PROFILE
@given(left=st.one_of(st.just(None), st.integers(0, 5)), right=st.one_of(st.just(None), st.integers(0, 5)),
       sq=st.integers(1, 9), extra=st.integers(0, 4))
def test_band_args_flags_show_the_band_under_bottom_right_alignment(left, right, sq, extra):
    """The flags `band_args` gives a band containing the diagonal make `fa4::attention` show each query exactly
    the band's keys: on square scores, and shifted to the bottom-right corner (Sk = Sq + extra) as FA4 aligns
    it. Read from the op: uniform scores, V the identity over keys, so out[i, j] > 0 where key j is visible."""
    band = Band(-INF if left is None else -left, INF if right is None else right)
    flags = masks.band_args(band)
    sk = sq + extra
    d = 8 * math.ceil(sk / 8)
    q, k = torch.zeros(1, 1, sq, d), torch.zeros(1, 1, sk, d)
    v = torch.eye(sk, d)[None, None]
    out, _ = torch.ops.fa4.attention(q, k, v, scale=1.0, **flags)
    assert torch.equal(out[0, 0, :, :sk] > 0, band_mask(band, sq, sk, offset=extra))


@PROFILE
@given(rows=sizes, cols=sizes, lower=diagonals, upper=diagonals, heads=st.integers(1, 3))
def test_buffer_read_by_value_is_its_band(rows, cols, lower, upper, heads):
    """A buffer whose 2-D slices are one band (nanoGPT's `bias`) is read as that band; any other is declined."""
    plane = torch.ones(rows, cols).tril(upper).triu(lower) * 2.0
    buffer = plane.expand(heads, rows, cols).clone()
    node = torch.fx.Graph().placeholder("bias")
    try:
        tv = masks.evaluate(node, {node: ("bias", buffer)})
    except MaskNotUnderstood as e:
        event("declined")
        assert "not a band" not in str(e), e  # tril/triu of ones is always a band
        raise
    torch.testing.assert_close(values_of(tv, rows, cols), plane)
