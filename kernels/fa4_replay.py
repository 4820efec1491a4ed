"""Launch replay for the FA4 adapter (`fa4.py`): FA4's forward without its Python entry point's host time.

FA4's Python entry point spends ~150 us per call on checks and key building before
it launches one compiled kernel, more than a decode step's whole GPU time. The first forward of each
exact call signature (shapes, strides, dtype, flags, whether seqused_k is given) runs
`_flash_attn_fwd` while recording what it does; when that was exactly one launch of a compiled
kernel whose tensor arguments are all ours (no temporary FA4 made, no other torch op ran), later
calls with the signature launch that kernel directly with their own tensors. Anything else keeps
going through `_flash_attn_fwd`. FA4_INDUCTOR_NO_REPLAY=1 turns replay off.
"""

from __future__ import annotations

import logging
import threading

from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

from . import layout, switches

log = logging.getLogger("fa4_inductor.kernels")

NO_REPLAY_ENV = switches.NO_REPLAY


class _Launch:
    """One recorded launch of a compiled FA4 kernel; `slots` says which argument is which of our tensors."""

    def __init__(self, fn, args: tuple, slots: dict[int, int]):
        self.fn, self.args, self.slots = fn, args, slots

    def __call__(self, tensors: tuple) -> None:
        args = list(self.args)
        for position, which in self.slots.items():
            args[position] = tensors[which]
        self.fn(*args)


class _Recorder(TorchDispatchMode):
    """Stands in for an FA4 compile cache during one call: notes each compiled-kernel launch, and
    (as a dispatch mode) every torch op other than allocations and views."""

    HARMLESS = {"empty", "empty_strided", "detach", "view", "transpose", "permute", "expand", "alias", "t",
                "as_strided", "select", "slice", "unsqueeze", "squeeze", "contiguous", "_unsafe_view"}

    def __init__(self, cache):
        super().__init__()
        self.cache, self.launches, self.other_ops, self.compiled = cache, [], [], False

    def __contains__(self, key):
        return key in self.cache

    def __setitem__(self, key, fn):
        self.compiled = True
        self.cache[key] = fn

    def __getitem__(self, key):
        fn = self.cache[key]

        def launch(*args, **kwargs):
            self.launches.append((fn, args, kwargs))
            return fn(*args, **kwargs)
        return launch

    def __getattr__(self, name):
        return getattr(self.cache, name)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ not in self.HARMLESS:
            self.other_ops.append(str(func))
        return func(*args, **(kwargs or {}))


def _same_tensor(a: Tensor, b: Tensor) -> bool:
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype and a.device == b.device)


def _as_replay(recorder: _Recorder, ours: tuple) -> tuple[_Launch | None, str]:
    if recorder.other_ops:
        return None, f"FA4 ran torch ops of its own ({', '.join(recorder.other_ops[:3])})"
    if len(recorder.launches) != 1:
        return None, f"FA4 launched {len(recorder.launches)} compiled kernels"
    fn, args, kwargs = recorder.launches[0]
    if kwargs:
        return None, "FA4 passed keyword arguments"
    slots = {}
    for position, a in enumerate(args):
        if isinstance(a, Tensor):
            which = [i for i, t in enumerate(ours) if t is not None and _same_tensor(a, t)]
            if len(which) != 1:
                return None, f"argument {position} is {'a tensor FA4 made' if not which else 'ambiguous'}"
            slots[position] = which[0]
        elif isinstance(a, (list, tuple)) and any(isinstance(x, Tensor) for x in a):
            return None, f"argument {position} holds tensors"
    # Keep no tensor alive: CUDA-graph pools (reduce-overhead) must own every allocation they made.
    return _Launch(fn, tuple(None if p in slots else a for p, a in enumerate(args)), slots), "replayable"


_LAUNCHES = layout.SignatureCache(1024)
_RECORD_LOCK = threading.Lock()


def launch_forward(fa, tensors: tuple, flags: tuple, call) -> None:
    """Runs `call` (which goes through `_flash_attn_fwd`), or replays its recorded launch."""
    if NO_REPLAY_ENV in switches.current().on or any(isinstance(t, FakeTensor) for t in tensors):
        call()
        return
    key = flags + layout.describe(*tensors)
    launch = _LAUNCHES.get(key)
    if launch is not None:
        launch(tensors)
        return
    if key in _LAUNCHES:  # recorded as not replayable
        call()
        return
    with _RECORD_LOCK:
        cache = fa._flash_attn_fwd.compile_cache
        recorder = _Recorder(cache)
        fa._flash_attn_fwd.compile_cache = recorder
        try:
            with recorder:
                call()
        finally:
            fa._flash_attn_fwd.compile_cache = cache
    if recorder.compiled:  # compiling may run torch ops of its own: decide on a later call
        return
    launch, why = _as_replay(recorder, tensors)
    log.debug("fa4: forward signature %s: %s", key, why)
    _LAUNCHES[key] = launch
