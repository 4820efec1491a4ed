"""Compiles the quack kernels our adapter launches (kernels/quack_w4a16.py) for sm_90a without a GPU: the
adapter's int8 and nvfp4 paths run end to end on CPU tensors with quack's launch turned off, so what they
hand quack (the repacked weights, the epilogue and its operands, tiles, split-k buffers) is traced and
compiled by the CuTe DSL. Run as a script (tests/test_quack_w4a16.py does, in a fresh process): on a machine
without triton it stands in a stub for the one triton class quack's autotuner subclasses, and answers the two
device queries quack's host code makes (an H100/H200's shared memory per SM, 132 SMs)."""

import importlib.util
import os
import sys
import types

os.environ.setdefault("QUACK_ARCH", "sm_90")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import torch  # noqa: E402

from fa4_inductor.kernels import quack_w4a16  # noqa: E402  (imports torch._dynamo before any triton stub)

if importlib.util.find_spec("triton") is None:
    triton = types.ModuleType("triton")
    triton.runtime = types.ModuleType("triton.runtime")
    triton.runtime.cache = types.ModuleType("triton.runtime.cache")
    triton.runtime.cache.FileCacheManager = type("FileCacheManager", (), {"__init__": lambda self, *a, **k: None})
    sys.modules.update({"triton": triton, "triton.runtime": triton.runtime,
                        "triton.runtime.cache": triton.runtime.cache})

from cutlass.base_dsl.runtime import cuda as cuda_helpers  # noqa: E402

import quack.gemm_runtime.host as quack_host  # noqa: E402
from quack.epilogue.frontend import EpiMod  # noqa: E402

cuda_helpers.get_device_attribute = lambda *args, **kwargs: 233472  # max shared memory per SM, sm90
quack_host.get_max_active_clusters = lambda cluster_size: 132 // cluster_size
compiled = []
gemm = EpiMod.gemm


def compile_only(self, *args, **kwargs):
    plan = gemm(self, *args, **{**kwargs, "_launch": False})
    compiled.append((plan.gemm_cls.__name__, plan.tile_M, plan.tile_N, plan.split_k))
    return plan


EpiMod.gemm = compile_only
quack_w4a16.unsupported_reason = lambda x, fmt, n, k: None  # the CPU tensors stand for CUDA ones


def main():
    torch.manual_seed(0)
    for m, n, k, scale_dtype, bias in ((1, 192, 320, torch.bfloat16, False), (64, 2048, 2048, torch.float32, True),
                                       (1, 2048, 8192, torch.bfloat16, True)):
        x = torch.randn(m, k, dtype=torch.bfloat16)
        w = torch.randint(-128, 128, (n, k), dtype=torch.int8)
        b = torch.randn(n, dtype=torch.bfloat16) if bias else None
        out = quack_w4a16.int8_matmul(x, w, torch.rand(n, dtype=scale_dtype), -1, b)
        assert out.shape == (m, n) and out.dtype == torch.bfloat16, (out.shape, out.dtype)
    for m, n, k in ((1, 100, 128), (16, 2048, 2048)):
        w_fp4 = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
        block_scale = torch.rand(n, k // 16).to(torch.float8_e4m3fn)
        out = quack_w4a16.nvfp4_matmul(torch.randn(m, k, dtype=torch.bfloat16), w_fp4, block_scale, torch.tensor(0.5))
        assert out.shape == (m, n) and out.is_contiguous(), out.shape
    for row in compiled:
        print(*row)
    assert any(split_k > 1 for *_, split_k in compiled), compiled


if __name__ == "__main__":
    main()
