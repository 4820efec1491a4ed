"""The adapter to quack-kernels' SM90 mixed-input GEMM (`quack.gemm_w4`): out[M, N] = x[M, K] @ dequant(W)[N, K]^T
with x bf16 and W int8 or NVFP4, the weight decoded to bf16 in registers (it is the register-sourced A operand
of bf16 wgmma; fp32 accumulation), the output bf16.

    unsupported_reason(x, fmt, n, k) -> str | None      fmt "int8" or "nvfp4"
    int8_matmul(x2d, w_int8, w_scale, group_size, bias=None) -> Tensor
    nvfp4_matmul(x2d, w_fp4, w_block_scale, w_global_scale) -> Tensor

Weights are repacked into quack's fragment order once (`prepared_weights.get`; never per call, never during
CUDA-graph capture: the call before capture, which every capture path makes, prepares them):

- int8: w_int8 [N, K] -> `prepare_w4_weight(w, None, "int8")`, a [N/64, K/64, 128, 32] int8 blob. quack's int8
  format leaves the scale to the epilogue; ours multiplies the fp32 accumulator by the per-channel scale
  (a row vector read by the epilogue, in any float dtype, from the call's w_scale: nothing about the scale
  is cached, so a scale computed in the graph is fine) and adds the bias there, then rounds once to bf16:
      out = bf16(sum_k x[m, k] * w[n, k] * scale[n] + bias[n])      (the sum in fp32)
  Only per-channel scales: quack's int8 format has no group scales (`group_size` other than -1 declines).
- nvfp4: w_fp4 uint8 [N, K/2] (e2m1 codes, element 2i in the low nibble, 2i+1 in the high one: quack's
  packing too), w_block_scale float8_e4m3fn [N, K/16], w_global_scale a float32 0-d tensor:
      w[n, k] = e2m1(w)[n, k] * float(block_scale[n, k // 16]) * global_scale
  The weight and its block scales are repacked separately (each cache entry follows its own tensor; rows
  padded with zeros to a multiple of 128, quack's tile, as its `Nvfp4.prepare` does), and the global scale
  is read to a Python float once (`prepared_weights` keyed by that tensor: a sync on the first call) and
  rides the epilogue's alpha, an exact fp32 multiply. The e2m1 x e4m3 decode is exact in bf16. The global
  scale must be a tensor that lives across calls (a parameter or buffer): one computed in the graph would be
  read again every call and refuses CUDA-graph capture (prepared_weights says so).

Limits (`unsupported_reason`): CUDA sm90, x bfloat16, K a multiple of 64 (quack's k-tile), N a multiple of 64
for int8 (quack's int8 repack does not pad rows; nvfp4 takes any N, paying a copy of the output when N is
not a multiple of 128), at least one row, quack-kernels importable. quack is imported on first use only, so
this module imports on a machine without CUDA (or triton).
"""

from __future__ import annotations

import functools
import logging
from typing import Optional

import torch
from torch import Tensor

from . import layout, prepared_weights, switches

log = logging.getLogger("fa4_inductor.kernels")

FORMATS = ("int8", "nvfp4")
K_TILE = 64  # quack's W4A16 k-tile: K must be a multiple of it (both formats)
INT8_ROWS = 64  # quack's int8 repack takes weights of a multiple of 64 rows and does not pad them
NVFP4_ROWS = 128  # quack's Nvfp4.prepare pads rows to a multiple of 128; so do we


@functools.cache
def _quack():
    """(quack.gemm_w4, None), or (None, why quack cannot be imported)."""
    try:
        from quack import gemm_w4
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] == "quack":
            return None, "quack-kernels is not installed"
        return None, f"quack-kernels cannot be imported: {e}"
    except Exception as e:  # cutlass / triton / CUDA driver problems surface here
        log.warning("importing quack.gemm_w4 failed", exc_info=True)
        return None, f"quack-kernels cannot be imported: {type(e).__name__}: {e}"
    return gemm_w4, None


def unsupported_reason(x: Tensor, fmt: str, n: int, k: int) -> str | None:
    """Why quack's W4A16 GEMM cannot multiply x [..., k] by a weight of `fmt` with n rows, or None."""
    capability = switches.capability(x.device.index) if x.device.type == "cuda" else None
    return limits_reason(x.device.type, x.dtype, capability, fmt, n, k, x.numel())


def limits_reason(device_type: str, dtype: torch.dtype, capability: tuple[int, int] | None, fmt: str, n: int,
                  k: int, numel: int = 1) -> str | None:
    """`unsupported_reason` on the call's description (a pure function but for the import of quack, last)."""
    if fmt not in FORMATS:
        return f"quack W4A16 format {fmt!r} is not wired (takes {', '.join(FORMATS)})"
    if device_type != "cuda":
        return f"quack's W4A16 GEMM runs on CUDA, not {device_type}"
    if dtype != torch.bfloat16:
        return f"quack's W4A16 GEMM takes bfloat16 activations, not {str(dtype).removeprefix('torch.')}"
    major, minor = capability
    if major != 9:
        return f"quack's W4A16 GEMM is wired here for sm90 (Hopper); this GPU is sm{major}{minor}"
    if k % K_TILE:
        return f"quack's W4A16 GEMM needs K a multiple of {K_TILE}; K is {k}"
    if fmt == "int8" and n % INT8_ROWS:
        return f"quack's int8 weights need N a multiple of {INT8_ROWS} (its repack does not pad); N is {n}"
    if numel == 0:
        return "x has no rows"
    return _quack()[1]


def _require():
    gemm_w4, reason = _quack()
    if gemm_w4 is None:
        raise NotImplementedError(f"the quack W4A16 adapter cannot run: {reason}")
    return gemm_w4


def _rows_2d(x2d: Tensor) -> Tensor:
    """x as quack's TMA wants it: contiguous, 16-byte aligned."""
    x2d = x2d.contiguous()
    return x2d if x2d.data_ptr() % 16 == 0 else x2d.clone()


def _vector(v: Tensor) -> Tensor:
    """A per-channel vector as the epilogue's cp.async reads it: contiguous, 16-byte aligned."""
    v = v.contiguous()
    return v if v.data_ptr() % 16 == 0 else v.clone()


# --------------------------------------------------------------------------------------------------- int8


def prepare_int8(w_int8: Tensor) -> Tensor:
    """w_int8 [N, K] in quack's int8 fragment order (built once per weight)."""
    return prepared_weights.get(w_int8, "quack_int8", lambda: _require().prepare_w4_weight(w_int8, None, "int8")[0])


@functools.cache
def _int8_epilogues():
    """The epilogues of the int8 GEMM: the fp32 accumulator times the per-channel scale (a row vector in
    the caller's (M, N) orientation), plus the bias where there is one."""
    from quack.epilogue.frontend import gemm_epilogue
    from quack.epilogue.ops import RowVecLoad

    @gemm_epilogue(ops={"scale": RowVecLoad("scale")})
    def scaled(acc, scale):
        return {"D": acc * scale}

    @gemm_epilogue(ops={"scale": RowVecLoad("scale"), "bias": RowVecLoad("bias")})
    def scaled_bias(acc, scale, bias):
        return {"D": acc * scale + bias}

    return scaled, scaled_bias


_SPLIT_K_BUFFERS: dict = {}


def _split_k_buffers(out: Tensor, tile_m: int, tile_n: int):
    """quack's serial split-k turnstile and partials for this output geometry, made once and reused (the
    kernel leaves the turnstile reset), as `gemm_w4a16` does for its own calls."""
    from quack.gemm import _split_k_buffers as make
    from quack.gemm_config import SplitKMode

    m, n = out.shape
    key = (n, m, tile_m, tile_n, out.device.index)
    buffers = _SPLIT_K_BUFFERS.get(key)
    if buffers is None:
        buffers = _SPLIT_K_BUFFERS[key] = prepared_weights.outside_graph_pools(
            out.device, lambda: make(out.t()[None], SplitKMode.SERIAL, tile_m, tile_n, 1, 1, False))
    return buffers


def int8_matmul(x2d: Tensor, w_int8: Tensor, w_scale: Tensor, group_size: int = -1,
                bias: Optional[Tensor] = None) -> Tensor:
    """x2d [M, K] bf16 @ (w_int8 [N, K] * w_scale [N])^T (+ bias [N]) -> [M, N] bf16 (see the module docstring
    for the arithmetic). Callers ask `unsupported_reason(x2d, "int8", N, K)` first."""
    if group_size != -1:
        raise ValueError(f"quack's int8 format takes per-channel scales only, not groups of {group_size}")
    n, k = w_int8.shape
    reason = unsupported_reason(x2d, "int8", n, k)
    if reason is not None:
        raise ValueError(reason)
    _require()
    from quack.operand_transform.host import pick_w4_cfg

    x2d = _rows_2d(x2d)
    blob = prepare_int8(w_int8)
    m = x2d.shape[0]
    tile_m, tile_n, split_k = pick_w4_cfg(m, n, k // K_TILE, device=x2d.device)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=x2d.device)
    scaled, scaled_bias = _int8_epilogues()
    epi_args = {"scale": _vector(w_scale).unsqueeze(0)}
    if bias is not None:
        epi_args["bias"] = _vector(bias).unsqueeze(0)
    (scaled if bias is None else scaled_bias).gemm(
        x2d, blob, out, epi_args=epi_args, transform_a="int8", tile_M=tile_m, tile_N=tile_n, tile_K=K_TILE,
        cluster_M=1, cluster_N=1, split_k=split_k,
        split_k_buffers=_split_k_buffers(out, tile_m, tile_n) if split_k > 1 else None)
    return out


# -------------------------------------------------------------------------------------------------- nvfp4


def _pad_rows(t: Tensor, multiple: int) -> Tensor:
    pad = -t.shape[0] % multiple
    return t if pad == 0 else torch.cat([t, t.new_zeros(pad, *t.shape[1:])])


def prepare_nvfp4(w_fp4: Tensor, w_block_scale: Tensor, w_global_scale: Tensor) -> tuple[Tensor, Tensor, float]:
    """(weight blob, scale strip, global scale as a float): the blob and the float once per tensor; the strip
    (N * K / 16 bytes, a small gather) at every call, since torchao's block scales come out of an un-swizzle
    inside the graph, a new tensor at each call (under CUDA-graph capture it is recorded into the graph and
    follows the scales' values at every replay)."""
    from_u8 = (lambda t: t.view(torch.uint8)) if w_fp4.dtype != torch.uint8 else (lambda t: t)

    def blob():
        from quack.blockscaled.nvfp4_utils import repack_nvfp4_weight

        return repack_nvfp4_weight(_pad_rows(from_u8(w_fp4), NVFP4_ROWS))

    def strip():
        from quack.blockscaled.nvfp4_utils import repack_nvfp4_sf

        return repack_nvfp4_sf(_pad_rows(w_block_scale.view(torch.uint8), NVFP4_ROWS))

    _require()
    return (prepared_weights.get(w_fp4, "quack_nvfp4_weight", blob),
            strip(),
            prepared_weights.get(w_global_scale, "quack_nvfp4_global_scale", lambda: float(w_global_scale)))


_NVFP4_GEOMETRIES: set = set()


def nvfp4_matmul(x2d: Tensor, w_fp4: Tensor, w_block_scale: Tensor, w_global_scale: Tensor) -> Tensor:
    """x2d [M, K] bf16 @ dequant(w)^T -> [M, N] bf16, w as the module docstring says. Callers ask
    `unsupported_reason(x2d, "nvfp4", N, K)` first."""
    n, k = layout.nvfp4_operands(w_fp4, w_block_scale, w_global_scale)
    reason = unsupported_reason(x2d, "nvfp4", n, k)
    if reason is not None:
        raise ValueError(reason)
    gemm_w4 = _require()
    blob, strip, alpha = prepare_nvfp4(w_fp4, w_block_scale, w_global_scale)
    x2d = _rows_2d(x2d)

    def call():
        return gemm_w4.gemm_w4a16(x2d, blob, strip, tensor_scale=alpha, n_out=n, wformat="nvfp4")

    geometry = (x2d.shape[0], n, k, x2d.device.index)
    if geometry in _NVFP4_GEOMETRIES:
        out = call()
    else:  # gemm_w4a16 caches a split-k workspace per geometry at its first call: keep it out of graph pools
        out = prepared_weights.outside_graph_pools(x2d.device, call)
        _NVFP4_GEOMETRIES.add(geometry)
    return out if out.is_contiguous() else out.contiguous()  # N not a multiple of 128: quack slices its padding off
