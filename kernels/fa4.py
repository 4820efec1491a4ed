"""Adapter from `fa4::attention` to the flash-attn-4 package (`flash_attn.cute`).

Not wired yet: `unsupported_reason` names why FA4 does not take a call, and the CUDA path of
`fa4::attention` then runs the reference on the device.
"""

from __future__ import annotations


def unsupported_reason(q, k, v, **flags) -> str | None:
    return "the FA4 adapter is not wired yet (issue 4); running the reference on the device"
