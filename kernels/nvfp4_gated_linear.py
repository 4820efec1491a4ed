"""`fa4::nvfp4_gated_linear`: a gated MLP's first half, act(x @ gate^T) * (x @ up^T), over two NVFP4 weight-only
linears of one x and one shape, as one op, so that a decode step reads both weights and writes only the product in
one launch. act: "silu" (Llama, Qwen, Mistral) or "gelu_tanh" (Gemma's GELU, tanh approximation).

    h = torch.ops.fa4.nvfp4_gated_linear(x, [w_fp4_gate, w_fp4_up], [block_gate, block_up],
                                         [global_gate, global_up], scale_layout="rowmajor", activation="silu")

Each weight's operands are one `fa4::nvfp4_linear`'s (no bias); h [..., N] in x's dtype is, bit for bit on the
reference, `act(nvfp4_linear(x, gate)) * nvfp4_linear(x, up)` with act `F.silu` or `F.gelu(approximate="tanh")`: both
outputs, the activation's and the product each rounded to x's dtype, as the separate ops and eager round them.

Kernels: a CUDA call whose two weights `fa4::nvfp4_sibling_linears` would run in one launch of the integer GEMV (one
row of x) runs the gated integer GEMV (`nvfp4_int_gemv.run_gated`: each output's gate and up sums meet in one warp,
which stores the product; `lowering/gated_linears.py` emits the op, `backend(gated_linears=False)` turns it off).
Other calls run `fa4::nvfp4_sibling_linears`, then the activation and the product.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from . import library, nvfp4_int_gemv, nvfp4_linear, nvfp4_sibling_linears


ACTIVATIONS = {"silu": F.silu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}


def _check(x: Tensor, w_fp4: list, w_block_scale: list, w_global_scale: list, scale_layout: str,
           activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"fa4::nvfp4_gated_linear takes the activations {sorted(ACTIVATIONS)}, not {activation!r}")
    if not len(w_fp4) == len(w_block_scale) == len(w_global_scale) == 2:
        raise ValueError(f"fa4::nvfp4_gated_linear takes two weights (gate, up) and one block and global scale each; "
                         f"got {len(w_fp4)}, {len(w_block_scale)}, {len(w_global_scale)}")
    if w_fp4[0].shape != w_fp4[1].shape:
        raise ValueError(f"fa4::nvfp4_gated_linear takes gate and up weights of one shape, got "
                         f"{tuple(w_fp4[0].shape)} and {tuple(w_fp4[1].shape)}")
    for operands in zip(w_fp4, w_block_scale, w_global_scale):
        nvfp4_linear._check_inputs(x, *operands, None, scale_layout)


def nvfp4_gated_linear(x: Tensor, w_fp4: list[Tensor], w_block_scale: list[Tensor], w_global_scale: list[Tensor],
                       scale_layout: str = "rowmajor", activation: str = "silu") -> Tensor:
    """The reference, on any device: `fa4::nvfp4_linear` for each weight, then the activation and the product."""
    _check(x, w_fp4, w_block_scale, w_global_scale, scale_layout, activation)
    gate, up = (nvfp4_linear.nvfp4_linear(x, *operands, None, scale_layout=scale_layout)
                for operands in zip(w_fp4, w_block_scale, w_global_scale))
    return ACTIVATIONS[activation](gate) * up


def _nvfp4_gated_linear_cuda(x: Tensor, w_fp4: list[Tensor], w_block_scale: list[Tensor],
                             w_global_scale: list[Tensor], scale_layout: str = "rowmajor",
                             activation: str = "silu") -> Tensor:
    _check(x, w_fp4, w_block_scale, w_global_scale, scale_layout, activation)
    x2d = x.reshape(-1, x.shape[-1])
    if not nvfp4_sibling_linears.one_launch(x2d, w_fp4):
        gate, up = nvfp4_sibling_linears._nvfp4_sibling_linears_cuda(x, w_fp4, w_block_scale, w_global_scale,
                                                                     [None, None], scale_layout)
        return ACTIVATIONS[activation](gate) * up
    w_block_scale = [nvfp4_linear.rowmajor_block_scale(w, s, scale_layout) for w, s in zip(w_fp4, w_block_scale)]
    gate, up = zip(w_fp4, w_block_scale, w_global_scale)
    return nvfp4_int_gemv.run_gated(x2d, gate, up, activation=activation).view(*x.shape[:-1], w_fp4[0].shape[0])


def _nvfp4_gated_linear_fake(x, w_fp4, w_block_scale, w_global_scale, scale_layout="rowmajor", activation="silu"):
    _check(x, w_fp4, w_block_scale, w_global_scale, scale_layout, activation)
    return x.new_empty(*x.shape[:-1], w_fp4[0].shape[0])


library.define_op("nvfp4_gated_linear(Tensor x, Tensor[] w_fp4, Tensor[] w_block_scale, Tensor[] w_global_scale, "
                  "str scale_layout=\"rowmajor\", str activation=\"silu\") -> Tensor",
                  nvfp4_gated_linear, _nvfp4_gated_linear_cuda, _nvfp4_gated_linear_fake)
