"""kernels/prepared_weights.py: a weight is prepared once, again after it changes, and dropped with it."""

import gc

import torch

from fa4_inductor.kernels import prepared_weights


def _counting_build(w, calls):
    def build():
        calls.append(1)
        return w.float() * 2
    return build


def test_built_once_per_weight_and_kind():
    prepared_weights.clear()
    w, calls = torch.randn(8, 4), []
    first = prepared_weights.get(w, "x2", _counting_build(w, calls))
    again = prepared_weights.get(w, "x2", _counting_build(w, calls))
    assert again is first and len(calls) == 1
    prepared_weights.get(w, "other", _counting_build(w, calls))
    assert len(calls) == 2
    assert sorted(kind for _, kind, _ in prepared_weights.report()) == ["other", "x2"]
    assert prepared_weights.total_bytes() == 2 * 8 * 4 * 4


def test_rebuilt_after_in_place_update_and_new_storage():
    prepared_weights.clear()
    w, calls = torch.randn(8, 4), []
    prepared_weights.get(w, "x2", _counting_build(w, calls))
    w.add_(1)
    value = prepared_weights.get(w, "x2", _counting_build(w, calls))
    assert len(calls) == 2 and torch.equal(value, w * 2)
    w.data = torch.randn(8, 4)
    value = prepared_weights.get(w, "x2", _counting_build(w, calls))
    assert len(calls) == 3 and torch.equal(value, w * 2)


def test_entry_goes_with_the_weight():
    prepared_weights.clear()
    w = torch.randn(8, 4)
    prepared_weights.get(w, "x2", lambda: w * 2)
    assert len(prepared_weights.report()) == 1
    del w
    gc.collect()
    assert prepared_weights.report() == []


def test_the_front_door_reports_prepared_memory():
    """`fa4_inductor.prepared_memory()`: what is held, per weight and layout, and the total."""
    import fa4_inductor

    prepared_weights.clear()
    w = torch.randn(16, 8)
    prepared_weights.get(w, "x2", lambda: w.float() * 2)
    prepared_weights.get(w, "bytes", lambda: w.to(torch.uint8))
    held = fa4_inductor.prepared_memory()
    assert held.total_bytes == 16 * 8 * 4 + 16 * 8 and len(held.rows) == 2
    assert str(held).splitlines()[0] == "fa4_inductor: 2 prepared weights, 0.0 MiB"
    assert "[16, 8] x2: 0.00 MiB" in str(held)
    prepared_weights.clear()
    assert fa4_inductor.prepared_memory().rows == []


def test_get_or_record_builds_in_the_graph_what_capture_meets_first(monkeypatch):
    """During capture (stood in for: no GPU here) a weight met for the first time is built each time, inside the
    graph, and not kept; one prepared before capture is returned as prepared. `get` refuses the first case."""
    import pytest

    prepared_weights.clear()
    w, seen, calls = torch.randn(4, 4), torch.randn(4, 4), []
    kept = prepared_weights.get(seen, "x2", _counting_build(seen, calls))
    monkeypatch.setattr(prepared_weights, "_capturing", lambda weight: True)
    first = prepared_weights.get_or_record(w, "x2", _counting_build(w, calls))
    assert torch.equal(first, w * 2) and not prepared_weights.holds(w, "x2") and len(calls) == 2
    assert prepared_weights.get_or_record(w, "x2", _counting_build(w, calls)) is not first and len(calls) == 3
    assert prepared_weights.get_or_record(seen, "x2", _counting_build(seen, calls)) is kept and len(calls) == 3
    with pytest.raises(RuntimeError, match="during CUDA-graph capture"):
        prepared_weights.get(w, "x2", _counting_build(w, calls))
    prepared_weights.clear()
