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


def test_int8_gemm_table_rows_and_columns(tiny):
    table = quant.gemm_table(quant.INT8, "cpu", torch.bfloat16, models=("tiny",), rows=(1, 3))
    assert table.columns == ["model", "N x K", "M", "bf16 cuBLAS", "ours (op)", "ours: quack route",
                             "ours: dense route", "default compile", "fa4_inductor", "quack direct (no scale)",
                             "ours vs bf16", "ours vs default compile"]
    assert [row[:3] for row in table.rows] == [["tiny", "64 x 128", 1], ["tiny", "64 x 128", 3],
                                               ["tiny", "128 x 64", 1], ["tiny", "128 x 64", 3]]
    for row in table.rows:
        cells = dict(zip(table.columns, row))
        assert all(math.isfinite(cells[c]) and cells[c] > 0 for c in
                   ("bf16 cuBLAS", "ours (op)", "ours: dense route", "default compile", "fa4_inductor"))
        assert cells["ours: quack route"] == "failed: RuntimeError"  # quack declines the CPU: the reason is printed
        assert cells["ours vs bf16"].endswith("x")


def test_suite_skips_formats_it_cannot_measure(tiny, capsys):
    tables = list(quant.quant_suite("cpu", torch.bfloat16, models=("tiny",), formats=("nvfp4",), rows=(1,),
                                    e2e=False))
    if hasattr(torch.ops.fa4, "nvfp4_linear"):
        pytest.skip("the nvfp4 op exists: its rows need quack, which is not importable on the CPU machine")
    assert tables == []
    assert "no nvfp4 rows: torch.ops.fa4.nvfp4_linear is not registered" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown quant formats"):
        list(quant.quant_suite("cpu", formats=("int4",)))


def test_command_line_selection():
    import argparse

    args = argparse.Namespace(quant_models="llama-1b", quant_formats="int8,nvfp4", quant_rows="1,16",
                              quant_no_e2e=True, quant_prompt=4096)
    assert bench.quant_selection(args) == dict(models=("llama-1b",), formats=("int8", "nvfp4"), rows=(1, 16),
                                               e2e=False, e2e_prompt=4096)
    assert "quant" in bench.SUITES and "quant" not in bench.DEFAULT_SUITES
