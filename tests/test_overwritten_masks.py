"""A cloned tensor written whole in place, read as the value written (`lowering/overwritten_masks.py`): the rewritten
graph computes what the written one does, for whole writes and for the writes it leaves alone."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fa4_inductor.lowering import overwritten_masks
from fa4_inductor.lowering.passes import _fake_mode_of_graph


def compiled_with_overwrite(fn, *args):
    """fn compiled by Dynamo with `overwrite` run on its graph: (its output, how many writes were rewritten)."""
    done = []

    def backend(gm, example_inputs):
        done.append(overwritten_masks.overwrite(gm, _fake_mode_of_graph(gm)))
        return gm.forward

    torch._dynamo.reset()
    return torch.compile(fn, backend=backend, fullgraph=True)(*args), done[0]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(1, 5), cols=st.integers(1, 7), stop=st.integers(0, 9), read_view_after=st.booleans(),
       cast=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_the_rewritten_graph_computes_the_written_one(rows, cols, stop, read_view_after, cast, seed):
    """`m = base.clone(); view = m[:, :1]; m[:, :stop] = padded; ... m` for stops that cover the columns or not, a
    view taken before the write read after it or not, a value of another dtype or not: rewritten only when the write
    is whole and nothing reads the tensor through an earlier view."""
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))

    def fn(x):
        m = (x > 0).float().clone()
        view = m[:, :1]
        padded = m[:, :stop].masked_fill(m[:, :stop] == 0, -3.0)
        m[:, :stop] = padded.double() if cast else padded
        return (m * 2, view + 1) if read_view_after else m * 2

    got, done = compiled_with_overwrite(fn, x)
    expected = fn(x)
    for g, e in zip(got if read_view_after else [got], expected if read_view_after else [expected]):
        assert torch.equal(g, e) and g.dtype == e.dtype
    assert done == int(stop >= cols and not read_view_after)
