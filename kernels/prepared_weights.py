"""Weights prepared once for a kernel: a repack (int8 or NVFP4 weights into a kernel's layout) happens on
the first call that meets a weight, and again only if the weight changes, never per call.

    packed = prepared_weights.get(w, "quack_int8", lambda: repack(w))

The cache holds, per weight tensor (by identity, held weakly: the entry goes with the weight), one value
per `kind`. An entry is rebuilt when the weight's version counter or storage moved (an in-place update,
`load_state_dict`, `.data =`). Building during CUDA-graph capture is refused: the repack would be recorded
into the graph and rerun at every replay; callers prepare in the warm-up call that runs before capture
(Inductor's cudagraph trees and `torch.cuda.graphs` both warm up). `report()` lists what is held, with its
bytes, for `fa4_inductor`'s reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, TypeVar

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

T = TypeVar("T")


@dataclass
class _Entry:
    version: int
    data_ptr: int
    value: Any
    nbytes: int


_CACHE: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    return 0


def _capturing(weight: Tensor) -> bool:
    return weight.is_cuda and torch.cuda.is_current_stream_capturing()


def get(weight: Tensor, kind: Hashable, build: Callable[[], T]) -> T:
    """The value `build()` made for `weight` under `kind`, built now if there is none or `weight` changed
    since (version counter or storage)."""
    per_kind = _CACHE.get(weight)
    if per_kind is None:
        per_kind = _CACHE[weight] = {}
    version, data_ptr = weight._version, weight.data_ptr()
    entry = per_kind.get(kind)
    if entry is not None and entry.version == version and entry.data_ptr == data_ptr:
        return entry.value
    if _capturing(weight):
        raise RuntimeError(
            f"fa4: a {tuple(weight.shape)} weight would be prepared for {kind!r} during CUDA-graph capture; "
            "run the model once before capturing (torch.compile's reduce-overhead mode does), so that the "
            "prepared copy exists before the graph records")
    value = build()
    per_kind[kind] = _Entry(version, data_ptr, value, _tensor_bytes(value))
    return value


def report() -> list[tuple[tuple[int, ...], Hashable, int]]:
    """(weight shape, kind, bytes of the prepared value) for every live entry."""
    rows = []
    for weight, per_kind in list(_CACHE.items()):
        for kind, entry in per_kind.items():
            rows.append((tuple(weight.shape), kind, entry.nbytes))
    return rows


def total_bytes() -> int:
    return sum(nbytes for _, _, nbytes in report())


def clear() -> None:
    """Drops every prepared value (tests; freeing memory)."""
    _CACHE.clear()
