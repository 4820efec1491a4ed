"""What a rewrite pass did with each candidate subgraph it saw."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Record:
    family: str  # "sdpa", "handwritten", ...
    location: str  # model source, "file.py:12 in forward"
    rewritten: bool
    detail: str  # the op call when rewritten, the reason when not
    module: str = ""  # the attention module's path in the model, "model.layers.0.self_attn"

    def __str__(self) -> str:
        verdict = "rewritten" if self.rewritten else "kept"
        where = f"{self.module} ({self.location})" if self.module else self.location
        return f"[{verdict}] {self.family:<11} {where}: {self.detail}"


class Decline(Exception):
    """Raised by a matcher: the subgraph is a candidate but is not rewritten; the message says why."""
