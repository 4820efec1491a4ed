"""`fa4::nvfp4_sibling_linears`: two or three NVFP4 weight-only linears of the same x (a decoder layer's q / k / v
projections, its gate / up projections) as one op, so that a decode step reads their weights in one launch.

    outs = torch.ops.fa4.nvfp4_sibling_linears(x, [w_fp4, ...], [w_block_scale, ...], [w_global_scale, ...],
                                               [bias or None, ...], scale_layout="rowmajor")

Each (w_fp4, w_block_scale, w_global_scale, bias) is one `fa4::nvfp4_linear`'s operands (its module docstring),
all of x's K and one `scale_layout`; outs[i] is that op's output for weight i, bit for bit.

Kernels: a CUDA call runs the integer GEMV over all the weights in one launch (`nvfp4_int_gemv.run_siblings`) where
`fa4::nvfp4_linear` would run each on the integer GEMV, with their rows together deciding as one weight's would
(`w4a16_decode.int_gemv_route`): one row of x, and H200-measured (docs/benchmarks.md, session 26) 2.9 against 5.3 us
for Llama-1B's q / k / v chained as three launches, 6.5 against 11.3 for Llama-8B's, 8.1 against 8.7 and 25.0
against 27.7 for their gate / up. Other calls, and the CPU, run each weight through `fa4::nvfp4_linear`.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from . import library, nvfp4_int_gemv, nvfp4_linear, w4a16_decode


def _check(x: Tensor, w_fp4: list, w_block_scale: list, w_global_scale: list, bias: list, scale_layout: str) -> None:
    library.check_siblings("nvfp4_sibling_linears", {"weights": w_fp4, "block scales": w_block_scale,
                                                     "global scales": w_global_scale, "biases (or None)": bias})
    for operands in zip(w_fp4, w_block_scale, w_global_scale, bias):
        nvfp4_linear._check_inputs(x, *operands, scale_layout)


def nvfp4_sibling_linears(x: Tensor, w_fp4: list[Tensor], w_block_scale: list[Tensor], w_global_scale: list[Tensor],
                          bias: list[Optional[Tensor]], scale_layout: str = "rowmajor") -> list[Tensor]:
    """The reference, on any device: `fa4::nvfp4_linear`'s for each weight."""
    _check(x, w_fp4, w_block_scale, w_global_scale, bias, scale_layout)
    return [nvfp4_linear.nvfp4_linear(x, *operands, scale_layout=scale_layout)
            for operands in zip(w_fp4, w_block_scale, w_global_scale, bias)]


def one_launch(x2d: Tensor, w_fp4: list[Tensor]) -> bool:
    """Whether a CUDA call runs its weights in one launch of the integer GEMV (module docstring)."""
    k = 2 * w_fp4[0].shape[1]
    return all(nvfp4_linear.kernel_for(x2d, w)[0] == "w4a16" for w in w_fp4) and \
        w4a16_decode.int_gemv_route(x2d, sum(w.shape[0] for w in w_fp4), k)


def _nvfp4_sibling_linears_cuda(x: Tensor, w_fp4: list[Tensor], w_block_scale: list[Tensor],
                                w_global_scale: list[Tensor], bias: list[Optional[Tensor]],
                                scale_layout: str = "rowmajor") -> list[Tensor]:
    _check(x, w_fp4, w_block_scale, w_global_scale, bias, scale_layout)
    x2d = x.reshape(-1, x.shape[-1])
    if not one_launch(x2d, w_fp4):
        return [nvfp4_linear._nvfp4_linear_cuda(x, *operands, scale_layout=scale_layout)
                for operands in zip(w_fp4, w_block_scale, w_global_scale, bias)]
    w_block_scale = [nvfp4_linear.rowmajor_block_scale(w, s, scale_layout) for w, s in zip(w_fp4, w_block_scale)]
    outs = nvfp4_int_gemv.run_siblings(x2d, list(zip(w_fp4, w_block_scale, w_global_scale)))
    for out, b in zip(outs, bias):
        if b is not None:
            out.add_(b)
    return library.sibling_outputs(x, w_fp4, outs)


def _nvfp4_sibling_linears_fake(x, w_fp4, w_block_scale, w_global_scale, bias, scale_layout="rowmajor"):
    _check(x, w_fp4, w_block_scale, w_global_scale, bias, scale_layout)
    return library.sibling_outputs(x, w_fp4)


library.define_op("nvfp4_sibling_linears(Tensor x, Tensor[] w_fp4, Tensor[] w_block_scale, Tensor[] w_global_scale, "
                  "Tensor?[] bias, str scale_layout=\"rowmajor\") -> Tensor[]",
                  nvfp4_sibling_linears, _nvfp4_sibling_linears_cuda, _nvfp4_sibling_linears_fake)
