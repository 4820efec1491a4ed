"""kernels/quack_w4a16.py (the quack W4A16 adapter) and fa4::int8_linear's CUDA route table, on the CPU: the
limits as a pure function, declines with their reasons, the M crossover. tests/test_gpu_quant.py runs them."""

import pytest
import torch

from fa4_inductor.kernels import int8_linear as op
from fa4_inductor.kernels import quack_w4a16

BF16, SM90 = torch.bfloat16, (9, 0)


@pytest.mark.parametrize("args, reason", [
    (("cuda", BF16, SM90, "int4", 64, 64), "quack W4A16 format 'int4' is not wired (takes int8, nvfp4)"),
    (("cpu", BF16, None, "int8", 64, 64), "quack's W4A16 GEMM runs on CUDA, not cpu"),
    (("cuda", torch.float16, SM90, "int8", 64, 64), "quack's W4A16 GEMM takes bfloat16 activations, not float16"),
    (("cuda", BF16, (10, 0), "nvfp4", 64, 64), "quack's W4A16 GEMM is wired here for sm90 (Hopper); this GPU is sm100"),
    (("cuda", BF16, SM90, "nvfp4", 64, 96), "quack's W4A16 GEMM needs K a multiple of 64; K is 96"),
    (("cuda", BF16, SM90, "int8", 96, 64),
     "quack's int8 weights need N a multiple of 64 (its repack does not pad); N is 96"),
    (("cuda", BF16, SM90, "int8", 64, 64, 0), "x has no rows"),
])
def test_limits(args, reason):
    assert quack_w4a16.limits_reason(*args) == reason


def test_nvfp4_takes_any_n_and_the_last_word_is_quacks_import(monkeypatch):
    monkeypatch.setattr(quack_w4a16, "_quack", lambda: (object(), None))
    assert quack_w4a16.limits_reason("cuda", BF16, SM90, "nvfp4", 100, 64) is None
    assert quack_w4a16.limits_reason("cuda", BF16, SM90, "int8", 192, 320) is None
    monkeypatch.setattr(quack_w4a16, "_quack", lambda: (None, "quack-kernels is not installed"))
    assert quack_w4a16.limits_reason("cuda", BF16, SM90, "int8", 192, 320) == "quack-kernels is not installed"


def test_adapter_declines_the_cpu():
    x = torch.randn(4, 64, dtype=BF16)
    assert quack_w4a16.unsupported_reason(x, "int8", 64, 64) == "quack's W4A16 GEMM runs on CUDA, not cpu"
    with pytest.raises(ValueError, match="runs on CUDA, not cpu"):
        quack_w4a16.int8_matmul(x, torch.zeros(64, 64, dtype=torch.int8), torch.ones(64, dtype=BF16))
    with pytest.raises(ValueError, match="per-channel scales only, not groups of 16"):
        quack_w4a16.int8_matmul(x, torch.zeros(64, 64, dtype=torch.int8), torch.ones(64, 4, dtype=BF16), 16)


@pytest.mark.parametrize("change, message", [
    (dict(w_fp4=torch.zeros(64, 32, dtype=torch.int8)), r"nvfp4 weights are uint8 \[N, K/2\]"),
    (dict(w_block_scale=torch.ones(64, 4)), r"block scales are float8_e4m3fn \[64, 4\]"),
    (dict(w_global_scale=torch.ones(2)), "global scale is a float32 0-d tensor"),
])
def test_nvfp4_inputs_checked(change, message):
    args = dict(w_fp4=torch.zeros(64, 32, dtype=torch.uint8),
                w_block_scale=torch.ones(64, 4).to(torch.float8_e4m3fn), w_global_scale=torch.tensor(1.0)) | change
    with pytest.raises(ValueError, match=message):
        quack_w4a16.nvfp4_matmul(torch.randn(2, 64, dtype=BF16), **args)


def test_quack_import_is_lazy():
    """The module imports without quack (the CPU machine cannot import it: no triton); the reason says why."""
    gemm_w4, reason = quack_w4a16._quack()
    if gemm_w4 is not None:
        pytest.skip("quack imports here")
    assert reason.startswith("quack-kernels")


# ------------------------------------------------------------------------ fa4::int8_linear's CUDA routes


def test_rows_crossover_is_a_pure_function():
    narrow, wide = op.QUACK_WIDE_N - 1, op.QUACK_WIDE_N
    assert op.rows_reason(1, narrow) is None and op.rows_reason(op.QUACK_MAX_ROWS, narrow) is None
    assert op.rows_reason(op.QUACK_MAX_ROWS + 1, wide) is None and op.rows_reason(op.QUACK_MAX_ROWS_WIDE, wide) is None
    assert op.rows_reason(op.QUACK_MAX_ROWS + 1, narrow) == (
        f"{op.QUACK_MAX_ROWS + 1} rows > {op.QUACK_MAX_ROWS} over a weight of {narrow} rows: quack's int8 GEMM is "
        "measured faster than dequantize + cuBLAS up to there only (QUACK_MAX_ROWS, QUACK_MAX_ROWS_WIDE from "
        "QUACK_WIDE_N rows)")
    assert op.rows_reason(op.QUACK_MAX_ROWS_WIDE + 1, wide).startswith(
        f"{op.QUACK_MAX_ROWS_WIDE + 1} rows > {op.QUACK_MAX_ROWS_WIDE} over a weight of {wide} rows")


def call(m, n=64, k=64, group_size=-1, x_shape=None):
    x = torch.randn(*(x_shape or (m,)), k, dtype=BF16)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8)
    scale = torch.rand((n,) if group_size == -1 else (n, k // group_size), dtype=BF16)
    return x, w, scale


@pytest.fixture
def quack_takes_everything(monkeypatch):
    """quack's own limits pass (as on an H200) so that the table's other reasons show."""
    monkeypatch.setattr(quack_w4a16, "unsupported_reason", lambda x, fmt, n, k: None)


def test_route_by_rows(quack_takes_everything):
    ours_off_gpu = "the W4A16 decode GEMM runs on CUDA, not cpu"
    x, w, scale = call(op.QUACK_MAX_ROWS, x_shape=(2, op.QUACK_MAX_ROWS // 2))
    assert op.kernel_for(x, w, scale) == (
        "quack_int8", f"{op.QUACK.takes} ({op.QUACK_MAX_ROWS} rows > {op.W4A16_MAX_ROWS}, outside our W4A16 GEMM "
                      "(W4A16_MAX_ROWS))")
    x, w, scale = call(4)
    assert op.kernel_for(x, w, scale) == ("quack_int8", f"{op.QUACK.takes} ({ours_off_gpu})")
    x, w, scale = call(op.QUACK_MAX_ROWS + 1)
    assert op.kernel_for(x, w, scale)[0] == "dense"
    assert op.kernel_for(x, w, scale)[1].endswith(op.rows_reason(op.QUACK_MAX_ROWS + 1, 64))
    x, w, scale = call(4, group_size=16)
    assert op.kernel_for(x, w, scale, group_size=16) == (
        "dense", "our W4A16 GEMM takes per-channel int8 scales, not groups of 16; "
                 "quack's int8 GEMM takes per-channel scales, not groups of 16")


@pytest.fixture
def ours_takes_everything(monkeypatch):
    monkeypatch.setattr(op.w4a16_decode, "unsupported_reason", lambda x2d, fmt, n, k: None)


def test_ours_takes_decode_rows_of_weights_up_to_its_size(ours_takes_everything, quack_takes_everything):
    x, w, scale = call(op.W4A16_MAX_ROWS, x_shape=(2, op.W4A16_MAX_ROWS // 2))
    assert op.kernel_for(x, w, scale) == ("w4a16_int8", op.W4A16.takes)
    x, w, scale = call(op.W4A16_MAX_ROWS + 1)
    assert op.kernel_for(x, w, scale)[0] == "quack_int8"
    assert op.w4a16_int8_shape_reason(16, 2048, 8192) is None and op.w4a16_int8_shape_reason(16, 2048, 2048) is None
    assert op.w4a16_int8_shape_reason(8, 4096, 14336) is None
    assert "W4A16_MAX_ROWS_WIDE" in op.w4a16_int8_shape_reason(9, 4096, 14336)
    assert op.w4a16_int8_shape_reason(1, 8192, 8192) is None  # one row over a long K: ours measured faster
    assert op.w4a16_int8_shape_reason(8, 8192, 8192) is None and op.w4a16_int8_shape_reason(2, 8192, 2048) is None
    assert "8192 rows" in op.w4a16_int8_shape_reason(2, 14336, 4096)
    assert "W4A16_MAX_ROWS_WIDE" in op.w4a16_int8_shape_reason(9, 8192, 8192)
    # one row over a wide weight: our GEMV, measured faster than quack's, up to 16384 rows (Llama-8B's gate / up)
    assert op.w4a16_int8_shape_reason(1, 8192, 2048) is None
    assert op.w4a16_int8_shape_reason(1, 14336, 4096) is None
    assert "at most 16384 rows" in op.w4a16_int8_shape_reason(1, 128256, 4096)  # Llama-8B's lm_head: quack
    assert op.w4a16_int8_shape_reason(1, 28672, 8192) is None  # a long K: ours
    x = torch.randn(2, 4096, dtype=BF16)
    wide = torch.zeros(14336, 4096, dtype=torch.int8)
    route, why = op.kernel_for(x, wide, torch.ones(14336, dtype=BF16))
    assert route == "quack_int8" and "8192 rows" in why


def test_ours_route_flattens_x_and_passes_the_bias(monkeypatch):
    seen = []

    def fake(x2d, w_int8, w_scale, bias=None):
        seen.append((tuple(x2d.shape), bias))
        return torch.zeros(x2d.shape[0], w_int8.shape[0], dtype=x2d.dtype)

    monkeypatch.setattr(op.w4a16_decode, "int8_matmul", fake)
    x, w, scale = call(6, x_shape=(2, 3))
    bias = torch.randn(64, dtype=BF16)
    out = op.W4A16.run(x, w, scale, bias, scale_after_matmul=True)
    assert out.shape == (2, 3, 64) and seen == [((6, 64), bias)]


def test_the_cpu_tensor_goes_dense_with_the_reasons():
    x, w, scale = call(4)
    assert op.kernel_for(x, w, scale) == (
        "dense", "the W4A16 decode GEMM runs on CUDA, not cpu; quack's W4A16 GEMM runs on CUDA, not cpu")


def test_quack_route_flattens_x_and_passes_the_bias(monkeypatch):
    seen = []

    def fake(x2d, w_int8, w_scale, group_size, bias):
        seen.append((tuple(x2d.shape), bias))
        return torch.zeros(x2d.shape[0], w_int8.shape[0], dtype=x2d.dtype)

    monkeypatch.setattr(quack_w4a16, "int8_matmul", fake)
    x, w, scale = call(6, x_shape=(2, 3))
    bias = torch.randn(64, dtype=BF16)
    out = op.QUACK.run(x, w, scale, bias, scale_after_matmul=True)
    assert out.shape == (2, 3, 64) and seen == [((6, 64), bias)]


def test_dense_route_is_the_reference():
    x, w, scale = call(5)
    assert torch.equal(op.DENSE.run(x, w, scale, scale_after_matmul=True), op.int8_linear(x, w, scale,
                                                                                          scale_after_matmul=True))


@pytest.mark.slow
def test_the_kernels_the_adapter_launches_compile_for_sm90():
    """tests/quack_compile_check.py, in a fresh process: the int8 epilogue GEMMs (bf16 / float32 scales, with and
    without bias, split-k) and the nvfp4 GEMM (N padded and not) traced and compiled for sm_90a on the CPU."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("cutlass")
    if importlib.util.find_spec("quack") is None:  # installed, not imported: it needs triton, which the script stubs
        pytest.skip("quack-kernels (the quant extra) is not installed")
    script = Path(__file__).with_name("quack_compile_check.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    kernels = [line.split()[0] for line in done.stdout.splitlines() if line.startswith("GemmMod_")]
    assert len(kernels) == 5 and sum(k.startswith("GemmMod_scaled_bias") for k in kernels) == 2, done.stdout
