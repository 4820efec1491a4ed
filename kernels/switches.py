"""Environment switches of the CUDA kernels, read at call time (tests and A/B benchmarks flip them)."""

from __future__ import annotations

import os

DISABLE_FA4 = "FA4_INDUCTOR_DISABLE_FA4"
DISABLE_DECODE = "FA4_INDUCTOR_DISABLE_DECODE"
NO_REPLAY = "FA4_INDUCTOR_NO_REPLAY"
ROUTING = (DISABLE_FA4, DISABLE_DECODE)  # the switches that change which kernel a call gets


def is_on(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in ("1", "true", "yes", "on")


def routing_state() -> tuple:
    return tuple(os.environ.get(name) for name in ROUTING)
