"""Weights prepared once for a kernel: a repack (int8 or NVFP4 weights into a kernel's layout) happens on
the first call that meets a weight, and again only if the weight changes, never per call.

    packed = prepared_weights.get(w, "quack_int8", lambda: repack(w))

The cache holds, per weight tensor (by identity, held weakly: the entry goes with the weight), one value
per `kind`. An entry is rebuilt when the weight's version counter or storage moved (an in-place update,
`load_state_dict`, `.data =`). Building during CUDA-graph capture is refused: the repack would be recorded
into the graph and rerun at every replay; callers prepare in the warm-up call that runs before capture
(Inductor's cudagraph trees and `torch.cuda.graphs` both warm up). A CUDA build runs `outside_graph_pools`
(the trees' warm-up allocates from the graph's private pool). `report()` lists what is held, with its bytes,
for `fa4_inductor`'s reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Sequence, TypeVar

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
    depends: tuple = ()  # (tensor, version) of each other tensor the value was built from, held


def _stamp(tensors) -> tuple:
    return tuple((t, t._version) for t in tensors)


def _same(stamp: tuple, tensors) -> bool:
    """Each tensor is the held one or a view of its memory (held, so not reused) with the same shape and strides,
    unchanged since (views share their base's version counter)."""
    return len(stamp) == len(tensors) and all(
        (held is t or (held.data_ptr() == t.data_ptr() and held.shape == t.shape and held.stride() == t.stride()
                       and held.dtype == t.dtype and held.device == t.device)) and version == t._version
        for (held, version), t in zip(stamp, tensors))


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


def outside_graph_pools(device: torch.device, fn: Callable[[], T]) -> T:
    """`fn()` with its CUDA allocations from the ordinary allocator, ordered after the current stream's work and
    before its next: on a side stream, in a helper thread. Inductor's cudagraph trees send every allocation of
    the warm-up thread to the graph's private pool, where a tensor kept past the graph (a prepared weight, a
    kernel's cached workspace) is an error. Not during CUDA-graph capture (the work must be recorded): there
    `fn()` runs as is."""
    if device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return fn()
    import threading

    main = torch.cuda.current_stream(device)
    side = _SIDE_STREAMS.get(device)
    if side is None:
        side = _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    side.wait_stream(main)
    result: list = []

    def work():
        try:
            with torch.cuda.device(device), torch.cuda.stream(side):
                # A new thread has no current CUDA context until a runtime call binds the device's primary one;
                # driver-API callers in `fn` (CuTe DSL's HardwareInfo, which quack's persistent GEMMs ask for
                # their cluster count) fail without it (CUDA_ERROR_INVALID_CONTEXT).
                torch.cuda.mem_get_info(device)
                result.append((True, fn()))
        except BaseException as e:  # re-raised in the caller's thread
            result.append((False, e))

    thread = threading.Thread(target=work, name="fa4-outside-graph-pools")
    thread.start()
    thread.join()
    ok, value = result[0]
    if not ok:
        raise value
    main.wait_stream(side)
    for t in _tensors(value):
        if t.is_cuda:
            t.record_stream(main)
    return value


def get(weight: Tensor, kind: Hashable, build: Callable[[], T], depends: Sequence[Tensor] = ()) -> T:
    """The value `build()` made for `weight` under `kind`, built now if there is none or `weight` changed
    since (version counter or storage). `depends`: other tensors the value is built from (a weight's block
    scales), held by the entry; the value is rebuilt when one of them is not the same memory (a view of it is:
    an op that reshapes the scales each call) or changed."""
    per_kind = _CACHE.get(weight)
    if per_kind is None:
        per_kind = _CACHE[weight] = {}
    version, data_ptr = weight._version, weight.data_ptr()
    entry = per_kind.get(kind)
    if (entry is not None and entry.version == version and entry.data_ptr == data_ptr
            and _same(entry.depends, depends)):
        return entry.value
    if _capturing(weight):
        raise RuntimeError(
            f"fa4: a {tuple(weight.shape)} weight would be prepared for {kind!r} during CUDA-graph capture; "
            "run the model once before capturing (torch.compile's reduce-overhead mode does), so that the "
            "prepared copy exists before the graph records")
    value = outside_graph_pools(weight.device, build)
    per_kind[kind] = _Entry(version, data_ptr, value, sum(t.numel() * t.element_size() for t in _tensors(value)),
                            _stamp(depends))
    return value


def get_or_record(weight: Tensor, kind: Hashable, build: Callable[[], T]) -> T:
    """`get`, except for a weight met for the first time during CUDA-graph capture: there `build()` runs inside
    the graph (recorded, so its replays follow the weight's values) where `get` would refuse. For values cheap
    enough to recompute per replay (a layout change of block scales)."""
    if _capturing(weight) and not holds(weight, kind):
        return build()
    return get(weight, kind, build)


def holds(weight: Tensor, kind: Hashable) -> bool:
    """Whether `get(weight, kind, ...)` would return a value without building one."""
    entry = (_CACHE.get(weight) or {}).get(kind)
    return entry is not None and entry.version == weight._version and entry.data_ptr == weight.data_ptr()


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
