"""The keyword flags of `fa4::attention` (and its backward), named and defaulted in one place.

Device modules take them as `**flags` and read them through `Flags(**flags)`, which fills in the
defaults a caller left out."""

from __future__ import annotations

from typing import NamedTuple


class Flags(NamedTuple):
    scale: float
    """Multiplies q.k before the softcap and the softmax."""
    causal: bool = False
    """Query row i sees keys j <= i + Sk - Sq (FlashAttention's bottom-right alignment)."""
    window_left: int = -1
    """Keys at most this far left of the diagonal; -1: unbounded."""
    window_right: int = -1
    """Keys at most this far right of the diagonal; -1: unbounded."""
    softcap: float = 0.0
    """`softcap * tanh(s / softcap)` on the scaled scores; 0: off."""

    @property
    def banded(self) -> bool:
        """A query sees only keys near its diagonal (causal or a window): queries may see no key at all."""
        return self.causal or self.window_left >= 0 or self.window_right >= 0


SCHEMA = "float scale, " + ", ".join(f"{type(d).__name__} {name}={d}" for name, d in Flags._field_defaults.items())
"""The flags as a torch.library schema fragment (explicit `int`s: the window bounds are compile-time constants)."""
