"""Environment switches of the CUDA kernels, read at call time (tests and A/B benchmarks flip them), and
the gate every CUDA kernel of ours starts with."""

from __future__ import annotations

import functools
import os

DISABLE_FA4 = "FA4_INDUCTOR_DISABLE_FA4"
DISABLE_DECODE = "FA4_INDUCTOR_DISABLE_DECODE"
NO_REPLAY = "FA4_INDUCTOR_NO_REPLAY"
DECODE_EVERYWHERE = "FA4_INDUCTOR_DECODE_EVERYWHERE"  # fixed-length decode calls to our kernel, not cuDNN SDPA
ROUTING = (DISABLE_FA4, DISABLE_DECODE, DECODE_EVERYWHERE)  # the switches that change which kernel a call gets


def is_on(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in ("1", "true", "yes", "on")


def routing_state() -> tuple:
    return tuple(os.environ.get(name) for name in ROUTING)


def gate(kernel: str, switch: str, q, dtypes: tuple) -> str | None:
    """The checks every CUDA kernel of ours starts with: why `kernel` cannot take q, or None.

    `switch` turns the kernel off; then the device must be CUDA and q's dtype one of `dtypes`."""
    if is_on(switch):
        return f"{kernel} is disabled by {switch}"
    if q.device.type != "cuda":
        return f"{kernel} runs on CUDA, not {q.device.type}"
    if q.dtype not in dtypes:
        names = " / ".join(str(d).removeprefix("torch.") for d in dtypes)
        return f"{kernel} takes {names}, not {str(q.dtype).removeprefix('torch.')}"
    return None


@functools.cache
def capability(device_index: int | None) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device (None: the current one)."""
    import torch

    return torch.cuda.get_device_capability(device_index)
