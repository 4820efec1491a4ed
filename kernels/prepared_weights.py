"""Weights prepared once for a kernel: a repack (int8 or NVFP4 weights into a kernel's layout) happens on
the first call that meets a weight, and again only if the weight changes, never per call.

    packed = prepared_weights.get(w, "quack_int8", lambda: repack(w))

The cache holds, per weight tensor (by identity, held weakly: the entry goes with the weight), one value
per `kind`. An entry is rebuilt when the weight's version counter or storage moved (an in-place update,
`load_state_dict`, `.data =`). Building during CUDA-graph capture is refused: the repack would be recorded
into the graph and rerun at every replay; callers prepare in the warm-up call that runs before capture
(Inductor's cudagraph trees and `torch.cuda.graphs` both warm up). A CUDA build runs on a side stream: the
trees' warm-up allocates the current stream's memory from the graph's private pool, where a tensor kept
past the graph is an error; the side stream's allocations come from the ordinary allocator. `report()`
lists what is held, with its bytes, for `fa4_inductor`'s reports.
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


def _capturing(weight: Tensor) -> bool:
    return weight.is_cuda and torch.cuda.is_current_stream_capturing()


def _tensors(value: Any):
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


_SIDE_STREAMS: dict = {}


def _build_outside_pools(weight: Tensor, build: Callable[[], T]) -> T:
    """`build()` on a side stream of the weight's device, ordered after the current stream's work and before
    its next (see the module docstring for why)."""
    if not weight.is_cuda:
        return build()
    main = torch.cuda.current_stream(weight.device)
    side = _SIDE_STREAMS.get(weight.device)
    if side is None:
        side = _SIDE_STREAMS[weight.device] = torch.cuda.Stream(weight.device)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        value = build()
    main.wait_stream(side)
    for t in _tensors(value):
        if t.is_cuda:
            t.record_stream(main)
    return value


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
    value = _build_outside_pools(weight, build)
    per_kind[kind] = _Entry(version, data_ptr, value, sum(t.numel() * t.element_size() for t in _tensors(value)))
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
