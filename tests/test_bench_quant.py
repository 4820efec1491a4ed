"""The `quant` bench suite's code paths on the CPU, tiny shapes (the numbers mean nothing here; the compiled
columns run the module eagerly, quack's columns fail without CUDA and say so)."""

import math

import pytest
import torch

from fa4_inductor import bench
from fa4_inductor.bench import quant

pytest.importorskip("torchao")


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(quant, "SHAPES", {"tiny": ((64, 128), (128, 64))})
    monkeypatch.setattr(quant, "_compiled", lambda module, backend: module)


@pytest.mark.slow  # 31 s: the fast tier's 5 minutes
def test_int8_gemm_table_rows_and_columns(tiny):
    table = quant.gemm_table(quant.INT8, "cpu", torch.bfloat16, models=("tiny",), rows=(1, 3))
    assert table.columns == ["model", "N x K", "M", "bf16 cuBLAS", "ours (op)", "ours: quack route",
                             "ours: dense route", "default compile", "fa4_inductor", "quack direct (no scale)",
                             "fa4_inductor vs bf16", "fa4_inductor vs default compile"]
    assert [row[:3] for row in table.rows] == [["tiny", "64 x 128", 1], ["tiny", "64 x 128", 3],
                                               ["tiny", "128 x 64", 1], ["tiny", "128 x 64", 3]]
    for row in table.rows:
        cells = dict(zip(table.columns, row))
        assert all(math.isfinite(cells[c]) and cells[c] > 0 for c in
                   ("bf16 cuBLAS", "ours (op)", "ours: dense route", "default compile", "fa4_inductor"))
        assert cells["ours: quack route"] == "failed: RuntimeError"  # quack declines the CPU: the reason is printed
        assert cells["fa4_inductor vs bf16"] == f"{cells['bf16 cuBLAS'] / cells['fa4_inductor']:.2f}x"


def test_columns_are_timed_in_alternating_rounds_and_a_failure_is_not_retried(monkeypatch):
    calls = []
    timings = {"a": iter([5.0, 1.0, 3.0]), "b": iter([2.0, 9.0, 4.0])}

    def fake_time_us(what, fn, x, device):
        name = what.split()[-1]
        calls.append(name)
        return "failed: RuntimeError" if name == "c" else next(timings[name])

    monkeypatch.setattr(quant, "_time_us", fake_time_us)
    times = quant._alternating_times_us("int8 64x128 M=1", dict.fromkeys("abc"), None, "cpu", rounds=3)
    assert calls == ["a", "b", "c", "b", "a", "a", "b"]
    assert times == {"a": 3.0, "b": 4.0, "c": "failed: RuntimeError"}


def test_suite_skips_formats_it_cannot_measure(tiny, capsys):
    tables = list(quant.quant_suite("cpu", torch.bfloat16, models=("tiny",), formats=("nvfp4",), rows=(1,),
                                    e2e=False, prefill=False))
    if hasattr(torch.ops.fa4, "nvfp4_linear"):
        pytest.skip("the nvfp4 op exists: its rows need quack, which is not importable on the CPU machine")
    assert tables == []
    assert "no nvfp4 rows: torch.ops.fa4.nvfp4_linear is not registered" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown quant formats"):
        list(quant.quant_suite("cpu", formats=("int4",)))


def test_command_line_selection():
    import argparse

    args = argparse.Namespace(quant_models="llama-1b", quant_formats="int8,nvfp4", quant_rows="1,16",
                              quant_no_e2e=True, quant_prompt=4096, quant_e2e_runs=None)
    assert bench.quant_selection(args) == dict(models=("llama-1b",), formats=("int8", "nvfp4"), rows=(1, 16),
                                               e2e=False, e2e_prompt=4096)
    args = argparse.Namespace(quant_models=None, quant_formats="none", quant_rows=None, quant_no_e2e=False,
                              quant_prompt=None, quant_e2e_runs="bf16:default, nvfp4:plain")
    assert bench.quant_selection(args) == dict(formats=("none",), e2e_runs=("bf16:default", "nvfp4:plain"))
    args.quant_no_e2e, args.quant_e2e_runs, args.quant_prefill_runs = True, None, "bf16:ours,int8:plain"
    assert bench.quant_selection(args) == dict(formats=("none",), e2e=False, prefill_runs=("bf16:ours", "int8:plain"))
    args.quant_no_prefill = True
    assert bench.quant_selection(args)["prefill"] is False
    assert "quant" in bench.SUITES and "quant" not in bench.DEFAULT_SUITES


def test_e2e_runs_name_every_row_and_refuse_unknown_ones():
    assert quant.e2e_runs(("int8", "nvfp4")) == ["bf16:default", "bf16:ours", "int8:default", "int8:ours",
                                                 "int8:plain", "nvfp4:default", "nvfp4:ours", "nvfp4:plain"]
    with pytest.raises(ValueError, match=r"unknown end-to-end runs \['nvfp4:plain'\]"):
        quant.e2e_table("cpu", formats=("int8",), runs=("nvfp4:plain",))


@pytest.mark.slow  # three compiles of a tiny decoder on the CPU
def test_e2e_table_split_into_runs(capsys):
    """A table of the named runs only (a GPU call each), each result printed as it is measured."""
    pytest.importorskip("torchao")
    tiny_llama = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128)
    table = quant.e2e_table("cpu", torch.bfloat16, prompt=8, steps=5, model_overrides=tiny_llama, formats=("int8",),
                            runs=("int8:ours", "bf16:ours", "int8:plain"))
    assert [row[:2] for row in table.rows] == [["bf16", "fa4_inductor"], ["int8", "fa4_inductor"],
                                               ["int8", quant.PLAIN_INT8]]
    assert all(isinstance(row[2], float) for row in table.rows), table.rows
    assert [row[4] for row in table.rows] == ["n/a"] * 3  # no bf16 default-compile run to compare with
    err = capsys.readouterr().err
    assert "quant e2e bf16, fa4_inductor: " in err and "quant e2e int8, fa4_inductor: " in err and "ms/token" in err


@pytest.mark.slow  # seven compiles of a tiny decoder on the CPU
def test_e2e_table_has_the_plain_nvfp4_row():
    """The end-to-end table's NVFP4 rows: torchao's weights under default compile and ours, and the same weights
    through `nvfp4.from_torchao` under ours (no subclass around each call), whose logits equal the torchao
    ones under ours (the same weight bit for bit)."""
    pytest.importorskip("torchao")
    tiny_llama = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128)
    table = quant.e2e_table("cpu", torch.bfloat16, prompt=8, steps=5, model_overrides=tiny_llama, formats=("nvfp4",))
    assert [row[:2] for row in table.rows] == [
        ["bf16", "default torch.compile"], ["bf16", "fa4_inductor"], ["nvfp4", "default torch.compile"],
        ["nvfp4", "fa4_inductor"], ["nvfp4", quant.PLAIN_NVFP4]]
    cells = {row[1]: dict(zip(table.columns, row)) for row in table.rows if row[0] == "nvfp4"}
    assert all(isinstance(c["tokens/s"], float) for c in cells.values()), cells
    assert cells[quant.PLAIN_NVFP4][table.columns[-1]] == cells["fa4_inductor"][table.columns[-1]]


@pytest.mark.slow  # four compiles of a tiny decoder on the CPU
def test_prefill_table_times_and_compares_with_bf16(capsys):
    """The prefill table: each named run's prefill time and its logits error against the unquantized model run
    eagerly in float64: bf16's own rounding for the bf16 row, more for int8 weights (per-channel codes), still
    small; torchao's weights and the same codes as plain buffers give the same logits under ours."""
    tiny_llama = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128)
    table = quant.prefill_table("cpu", torch.bfloat16, seqlen=32, model_overrides=tiny_llama, formats=("int8",),
                                runs=("bf16:ours", "int8:ours", "int8:plain"))
    assert [row[:2] for row in table.rows] == [["bf16", "fa4_inductor"], ["int8", "fa4_inductor"],
                                               ["int8", quant.PLAIN_INT8]]
    cells = [dict(zip(table.columns, row)) for row in table.rows]
    assert all(isinstance(c["prefill ms"], float) for c in cells), cells
    error = [float(c["logits vs float64: relative RMS error"]) for c in cells]
    assert 0 < error[0] < error[1] < 2e-2, error
    assert error[1] == error[2]
    assert all(c["top-1 agreement"].endswith("%") for c in cells)
    assert "quant prefill int8, fa4_inductor: " in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"unknown prefill runs \['nvfp4:plain'\]"):
        quant.prefill_table("cpu", formats=("int8",), runs=("nvfp4:plain",))
