"""The backend's knobs: one frozen dataclass, one field per rewrite family."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Options:
    sdpa: bool = True
    """Rewrite `F.scaled_dot_product_attention` calls into `fa4::attention`."""

    handwritten: bool = True
    """Rewrite hand-written `softmax(q @ k^T * scale + mask) @ v` into `fa4::attention`."""

    gqa: bool = True
    """Fold K/V head repetition (repeat_kv, repeat_interleave, expand + reshape) into GQA."""

    padding: bool = True
    """Rewrite attention under a run-time padding mask (seqused_k, with an in-graph check of the mask's form)."""

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
