"""`fa4::int8_sibling_linears`: two or three int8 weight-only linears of the same x (a decoder layer's q / k / v
projections, its gate / up projections) as one op, so that a decode step reads their weights in one launch.

    outs = torch.ops.fa4.int8_sibling_linears(x, [w_int8, ...], [w_scale, ...], [bias or None, ...],
                                              group_size=-1, scale_after_matmul=False)

Each (w_int8, w_scale, bias) is one `fa4::int8_linear`'s operands (its module docstring), all of x's K and one
`group_size` and `scale_after_matmul`; outs[i] is that op's output for weight i.

Kernels: a CUDA call runs the fp32 GEMV over all the weights in one launch (`w4a16_decode.int8_gemv_siblings`) where
`fa4::int8_linear` would run each on it (its rows of x within the GEMV's, per-channel scales of one dtype), none
has a bias and their rows number at most ONE_LAUNCH_MAX_ROWS: the same arithmetic as each weight's launch (within its
rounding: the CTA shape follows the rows together). Other calls, and the CPU, run each weight through
`fa4::int8_linear`.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from . import int8_linear, library, w4a16_decode


ONE_LAUNCH_MAX_ROWS = 8192
"""The most rows (summed over the weights) that take one launch. H200, docs/benchmarks.md session 26 run 7, one row
of x, us, the calls chained / one launch: q / k / v of Llama-1B (3072 rows) 5.4 / 3.0 and of Llama-8B (6144) 11.8 /
6.7; gate / up of Llama-1B (16384 rows) 9.3 / 13.7 and of Llama-8B (28672) 34.6 / 35.8, where the GEMV's CTA shape for
the rows together loses to each weight's own."""


def _check(x: Tensor, w_int8: list, w_scale: list, bias: list, group_size: int, scale_after_matmul: bool) -> None:
    library.check_siblings("int8_sibling_linears", {"weights": w_int8, "scales": w_scale, "biases (or None)": bias})
    for operands in zip(w_int8, w_scale, bias):
        int8_linear._check_inputs(x, *operands, group_size, scale_after_matmul)


def int8_sibling_linears(x: Tensor, w_int8: list[Tensor], w_scale: list[Tensor], bias: list[Optional[Tensor]], *,
                         group_size: int = -1, scale_after_matmul: bool = False) -> list[Tensor]:
    """The reference, on any device: `fa4::int8_linear`'s for each weight."""
    _check(x, w_int8, w_scale, bias, group_size, scale_after_matmul)
    return [int8_linear.int8_linear(x, *operands, group_size=group_size, scale_after_matmul=scale_after_matmul)
            for operands in zip(w_int8, w_scale, bias)]


def one_launch(x2d: Tensor, w_int8: list[Tensor], w_scale: list[Tensor], bias: list[Optional[Tensor]],
               group_size: int = -1, scale_after_matmul: bool = False) -> bool:
    """Whether a CUDA call runs its weights in one launch of the GEMV (module docstring)."""
    flags = dict(group_size=group_size, scale_after_matmul=scale_after_matmul)
    if any(b is not None for b in bias) or len({s.dtype for s in w_scale}) != 1:
        return False
    if x2d.shape[0] > w4a16_decode.configured_gemv_rows() or sum(w.shape[0] for w in w_int8) > ONE_LAUNCH_MAX_ROWS:
        return False
    return all(int8_linear.kernel_for(x2d, w, s, None, **flags)[0] == int8_linear.W4A16.name
               for w, s in zip(w_int8, w_scale))


def _int8_sibling_linears_cuda(x: Tensor, w_int8: list[Tensor], w_scale: list[Tensor], bias: list[Optional[Tensor]],
                               *, group_size: int = -1, scale_after_matmul: bool = False) -> list[Tensor]:
    _check(x, w_int8, w_scale, bias, group_size, scale_after_matmul)
    x2d = x.reshape(-1, x.shape[-1])
    if not one_launch(x2d, w_int8, w_scale, bias, group_size, scale_after_matmul):
        return [int8_linear.int8_linear_cuda(x, *operands, group_size=group_size,
                                             scale_after_matmul=scale_after_matmul)
                for operands in zip(w_int8, w_scale, bias)]
    outs = w4a16_decode.int8_gemv_siblings(x2d, list(zip(w_int8, w_scale)))
    return library.sibling_outputs(x, w_int8, outs)


def _int8_sibling_linears_fake(x, w_int8, w_scale, bias, *, group_size=-1, scale_after_matmul=False):
    _check(x, w_int8, w_scale, bias, group_size, scale_after_matmul)
    return library.sibling_outputs(x, w_int8)


library.define_op("int8_sibling_linears(Tensor x, Tensor[] w_int8, Tensor[] w_scale, Tensor?[] bias, *, "
                  "int group_size=-1, bool scale_after_matmul=False) -> Tensor[]",
                  int8_sibling_linears, _int8_sibling_linears_cuda, _int8_sibling_linears_fake)
