"""What compiling a CuTe DSL kernel of ours takes, whichever kernel it is: the target arch, the
cutlass element types, one cache of compiled variants per kernel family (compiled under a lock, once
per process), and compiling against fake tensors, which needs no GPU (CUTE_DSL_ARCH=sm_90a on a CPU).

Importing this module imports no cutlass (~3 s); the helpers that need it import it when called.
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Hashable, Optional

import torch

from .. import switches

TVM_FFI_OPTIONS = "--enable-tvm-ffi"


def target_arch(device: torch.device, off_gpu: Optional[str] = None) -> str:
    """The arch to compile for ("sm_90a"): CUTE_DSL_ARCH when set, else the CUDA device's, else
    `off_gpu` for a device that is not CUDA (compiling on a CPU)."""
    override = switches.current().cute_dsl_arch
    if override:
        return override
    if device.type != "cuda" and off_gpu is not None:
        return off_gpu
    major, minor = switches.capability(device.index)
    return f"sm_{major}{minor}a"


def cutlass_dtype(dtype: torch.dtype):
    import cutlass

    return {torch.float16: cutlass.Float16, torch.bfloat16: cutlass.BFloat16, torch.float32: cutlass.Float32}[dtype]


def cute_for(arch: str):
    """`cutlass.cute`, with CUTE_DSL_ARCH defaulted to `arch` first (the DSL compiles for it)."""
    os.environ.setdefault(switches.CUTE_DSL_ARCH, arch)
    import cutlass.cute as cute

    return cute


def compile_for_tvm_ffi(cute, kernel, *fake_args, arch: Optional[str] = None):
    """`cute.compile` of `kernel` over fake arguments and a fake stream standing for the current torch
    stream (the TVM-FFI environment stream), so launches take torch tensors and need no stream argument.
    `arch` ("sm_100a"): compile for it whatever CUTE_DSL_ARCH says (one process compiles for several)."""
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    options = TVM_FFI_OPTIONS if arch is None else f"{TVM_FFI_OPTIONS} --gpu-arch {arch}"
    return cute.compile(kernel, *fake_args, stream, options=options)


class CompiledVariants:
    """A kernel family's compiled variants by key, each compiled once per process by `compile(key)`
    (under a lock: threads that miss together compile it once). Calling it returns the variant."""

    def __init__(self, compile: Callable[[Hashable], object]):
        self._compile = compile
        self._compiled: dict = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._compiled)

    def __call__(self, key: Hashable):
        fn = self._compiled.get(key)
        if fn is None:
            with self._lock:
                fn = self._compiled.get(key)
                if fn is None:
                    fn = self._compiled[key] = self._compile(key)
        return fn
