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
    """Rewrite non-causal attention under a run-time key-padding mask (encoders): seqused_k, with an
    in-graph check that the mask is right padding; any other mask stops the program with an error."""

    causal_padding: bool = False
    """Rewrite causal attention under a run-time padding mask (HF `generate`'s attention_mask), with an
    in-graph check that the mask hides no key the causal band shows. Off by default: it holds for
    unpadded batches only, and a padded batch would stop with an error (on CUDA a device-side assert,
    which ends the process) where default torch.compile runs it."""

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
