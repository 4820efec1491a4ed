"""The sweep suite on the CPU with tiny models (the numbers mean nothing here): its rows, its failure and
skip cells, and the same outputs from both backends."""

import math

import pytest
import torch

from fa4_inductor import bench
from fa4_inductor.bench import sweep

TINY_LLAMA = dict(intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128,
                  max_position_embeddings=256)
TINY_BERT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=128,
                 max_position_embeddings=24)
TINY_SWEEP = dict(llama_sizes=((64, 2),), decode_sizes=((64, 2),), seqlens=(16, 32), batches=(1, 2), decode_steps=2,
                  prefill_repeats=1, llama_overrides=TINY_LLAMA, bert_overrides=TINY_BERT)


def without_inductor(monkeypatch):
    """Compiles with Dynamo and our rewrites (or none, for the default backend) but no Inductor, keeping
    `dynamic` and `fullgraph`: the sweep's code paths in seconds rather than minutes."""
    import fa4_inductor

    def compile_without_inductor(model_fn, backend_name, mode=None, **kwargs):
        chosen = fa4_inductor.fa4_inductor.rewrite_only if backend_name == "fa4_inductor" else "eager"
        return torch.compile(model_fn, backend=chosen, **kwargs)

    monkeypatch.setattr(bench.models, "compile_model", compile_without_inductor)


def run_sweep(**overrides):
    (table,) = bench.sweep_suite("cpu", torch.float32, **{**TINY_SWEEP, **overrides})
    return table


@pytest.mark.slow
def test_sweep_rows_cover_prefill_decode_batches_and_padding(monkeypatch):
    without_inductor(monkeypatch)
    table = run_sweep()
    keys = [tuple(row[:4]) + (row[4] != "none",) for row in table.rows]
    llama_prefill = [("Llama h64 x2", "prefill", b, s, padded)
                     for b, padded in ((1, False), (2, False), (2, True)) for s in (16, 32)]
    llama_decode = [("Llama h64 x2", "decode", *key[2:]) for key in llama_prefill]
    bert = [("BERT h64 x2", "prefill", b, 16, padded) for b, padded in ((1, False), (2, False), (2, True))]
    assert keys == llama_prefill + llama_decode + bert  # BERT's 32 tokens exceed its 24 positions
    assert all(len(row) == len(table.columns) for row in table.rows)
    for row in table.rows:
        default_ms, ours_ms, speedup, below, difference, note = row[5:]
        assert isinstance(default_ms, float) and isinstance(ours_ms, float), row
        assert math.isfinite(default_ms) and math.isfinite(ours_ms) and default_ms > 0 and ours_ms > 0, row
        assert speedup == f"{default_ms / ours_ms:.2f}x" and below == ("yes" if default_ms / ours_ms < 0.98 else "no")
        assert float(difference) < 1e-4, row  # our op's CPU kernel against eager SDPA
        assert note == "", row
    assert [row[4] for row in table.rows if row[1] == "prefill" and row[2] == 2 and row[4] != "none"] == [
        "left, 1/2 rows", "left, 1/2 rows", "right, 1/2 rows"]
    assert "measured rows meet it" in table.note
    assert "| model | phase | batch | seq | padding | default ms | ours ms | speedup |" in table.markdown()


@pytest.mark.slow
def test_one_phase_alone(monkeypatch):
    without_inductor(monkeypatch)
    table = run_sweep(phases=("decode",), bert=False, seqlens=(16,), batches=(2,))
    assert [tuple(row[:5]) for row in table.rows] == [("Llama h64 x2", "decode", 2, 16, "none"),
                                                      ("Llama h64 x2", "decode", 2, 16, "left, 1/2 rows")]
    assert all(isinstance(row[5], float) and isinstance(row[6], float) for row in table.rows), table.rows


@pytest.mark.slow
def test_a_failed_row_is_reported_and_the_others_measured(monkeypatch, capsys):
    without_inductor(monkeypatch)
    real = sweep.decode_ms

    def broken_at_32(compiled_step, model, sweep_model, case, steps, device):
        if case.seq == 32:
            raise RuntimeError("cache slot out of range")
        return real(compiled_step, model, sweep_model, case, steps, device)

    real_timing, timings = sweep.timing.interleaved_median_ms, []

    def broken_second_prefill(fns, rounds):  # the prefill rows come in order: seq 16, then 32
        timings.append(rounds)
        if len(timings) == 2:
            raise RuntimeError("out of memory while timing")
        return real_timing(fns, rounds)

    monkeypatch.setattr(sweep, "decode_ms", broken_at_32)
    monkeypatch.setattr(sweep.timing, "interleaved_median_ms", broken_second_prefill)
    table = run_sweep(bert=False, batches=(1,))
    failed = [row for row in table.rows if row[3] == 32]
    assert [row[1] for row in failed] == ["prefill", "decode"]
    assert all(row[5:9] == ["failed", "failed", "n/a", "n/a"] for row in failed)
    assert "RuntimeError: out of memory while timing" in failed[0][-1]
    assert "RuntimeError: cache slot out of range" in failed[1][-1]
    assert all(isinstance(row[5], float) for row in table.rows if row not in failed)
    err = capsys.readouterr().err
    assert "cache slot out of range" in err
    # every row also goes to stderr as it is measured (a run cut short keeps them)
    printed = [line.strip() for line in err.splitlines() if line.startswith("  [row] | ")]
    assert sorted(printed) == sorted("[row] | " + " | ".join(map(str, row)) + " |" for row in table.rows)


def test_rows_past_the_time_budget_are_skipped(monkeypatch):
    without_inductor(monkeypatch)
    table = run_sweep(time_budget_s=0)
    assert len(table.rows) == 15
    assert all(row[5:7] == ["skipped", "skipped"] and "time budget" in row[-1] for row in table.rows)
    assert "0 of 0 measured rows meet it (15 not measured)" in table.note


@pytest.mark.slow
def test_rows_over_the_memory_cap_are_skipped(monkeypatch):
    without_inductor(monkeypatch)
    model = sweep.sweep_models(((64, 2),), (), False, TINY_LLAMA)[0].build("cpu", torch.float32)
    cap = sweep.estimated_gib(model, sweep.Case("prefill", 1, 16, False), 2) * 1.01
    table = run_sweep(bert=False, decode_sizes=(), batches=(1,), memory_cap_gib=cap)
    assert [(row[3], row[5]) for row in table.rows] == [(16, table.rows[0][5]), (32, "skipped")]
    assert isinstance(table.rows[0][5], float) and "GiB > cap" in table.rows[1][-1]


@pytest.mark.slow
def test_both_backends_compute_the_same_padded_prefill():
    """Default torch.compile and ours, with Inductor, on the sweep's inputs: a left-padded Llama prefill
    and a right-padded BERT forward agree within float32 tolerance."""
    llama_model, bert_model = sweep.sweep_models(((64, 1),), (), True, TINY_LLAMA, TINY_BERT)
    for sweep_model in (llama_model, bert_model):
        torch.manual_seed(0)
        model = sweep_model.build("cpu", torch.float32)
        tokens, mask = sweep.sweep_inputs(sweep_model, model.config.vocab_size, sweep.Case("prefill", 2, 16, True), "cpu")
        assert mask is not None and not mask.all()
        outputs = []
        for backend_name in ("inductor", "fa4_inductor"):
            torch._dynamo.reset()
            compiled = bench.models.compile_model(model, backend_name, dynamic=True)
            with torch.no_grad():
                outputs.append(sweep.prefill_call(compiled, sweep_model, tokens, mask)[1]())
        default, ours = outputs
        assert torch.allclose(ours, default, atol=1e-4, rtol=1e-4), (ours - default).abs().max()


def test_decode_runs_alternate_the_backends_and_take_each_median(monkeypatch):
    """Decode runs fall into fast and slow modes on the GPU whatever the backend, so a case's runs alternate
    (ABBA...) and each backend's ms is the median of its own runs; a backend that fails a case keeps its failure
    while the other is still measured."""
    monkeypatch.setattr(sweep.models, "compile_model", lambda step, backend, **kwargs: backend)
    monkeypatch.setattr(sweep, "decode_step", lambda model: None)
    calls = []
    ms = {"inductor": [5.0, 1.0, 3.0, 2.0, 100.0], "fa4_inductor": [10.0, 30.0, 20.0, 500.0, 40.0]}

    def decode_ms(backend, model, sweep_model, case, steps, device):
        if case.seq == 32 and backend == "fa4_inductor":
            raise RuntimeError("cache slot out of range")
        calls.append((backend, case.seq))
        return ms[backend][sum(1 for b, s in calls if b == backend and s == case.seq) - 1], f"logits {backend}"

    monkeypatch.setattr(sweep, "decode_ms", decode_ms)
    cases = [sweep.Case("decode", 2, seq, False) for seq in (16, 32)]
    results = {name: {} for name in sweep.BACKENDS}
    tiny = sweep.SweepModel("llama", (("hidden_size", 64), ("num_hidden_layers", 2)))
    sweep._measure_decode(results, None, tiny, cases, "cpu", "default", 2, deadline=math.inf)
    default, ours = sweep.BACKENDS.values()
    assert [b for b, seq in calls if seq == 16] == [default, ours, ours, default, default, ours, ours, default,
                                                    default, ours]
    assert results["default torch.compile"][cases[0]] == (3.0, "logits inductor")
    assert results["fa4_inductor"][cases[0]] == (30.0, "logits fa4_inductor")
    assert [b for b, seq in calls if seq == 32] == [default] * 5
    assert results["default torch.compile"][cases[1]] == (3.0, "logits inductor")
    assert "cache slot out of range" in results["fa4_inductor"][cases[1]]
