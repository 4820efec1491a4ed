"""Timing helpers shared by every bench suite and by `python -m fa4_inductor demo`.

- `gpu_ms`: GPU time of one call (`triton.testing.do_bench`, L2 flushed; or `do_bench_cudagraph`).
- `wall_ms`, `median_wall_ms`: wall-clock ms of whole calls, the device synchronized around each one;
  `interleaved_median_ms`: the same for several functions called in alternating rounds (A/B comparisons).
- `per_step_ms`: wall-clock ms a step of a loop (decode), after untimed warm-up steps.
- `host_us_per_call`: back-to-back calls without a sync, the host's launch cost when the kernels are tiny.

Wall-clock timings run with the objects that exist before them frozen (`gc_frozen`): a full collection of a heap
that compiling has grown takes milliseconds, and a host-bound timing would charge it to whichever call it fell in;
the collector still runs over what the timed code itself leaves behind, which is that code's cost.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from typing import Callable

import torch


def sync() -> None:
    """Waits for the GPU (nothing to wait for on a CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def gpu_ms(fn: Callable[[], object], cuda_graph: bool = False) -> float:
    """Median GPU milliseconds of `fn` (L2 flushed between runs); under a CUDA graph if asked. Without a
    GPU: `median_wall_ms`."""
    if not torch.cuda.is_available():
        return median_wall_ms(fn)
    from triton.testing import do_bench, do_bench_cudagraph

    fn()  # compile / warm up outside the graph
    torch.cuda.synchronize()
    if cuda_graph:
        return do_bench_cudagraph(fn, rep=50, return_mode="median")
    return do_bench(fn, warmup=10, rep=50, return_mode="median")


@contextlib.contextmanager
def gc_frozen():
    """Collects once, then keeps every object that exists out of the collector's sight until the block ends."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def wall_ms(fn: Callable[[], object]) -> float:
    """Wall-clock milliseconds of one call of `fn`, between two device syncs."""
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - start) * 1e3


def median_wall_ms(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
    """Median wall-clock milliseconds of `fn` over `repeats` calls (`wall_ms`), after `warmup` untimed calls (the
    first one compiles)."""
    for _ in range(warmup):
        fn()
    with gc_frozen():
        return statistics.median(wall_ms(fn) for _ in range(repeats))


def alternating(names, rounds: int):
    """Each of `names` once a round for `rounds` rounds, the order reversed every other round (A B, B A, A B, ...):
    a drift of the machine over the rounds falls on every name alike."""
    for round_index in range(rounds):
        yield from (names if round_index % 2 == 0 else reversed(names))


def interleaved_median(measure: Callable[[str], float | str], names: list[str], rounds: int) -> dict:
    """The median of measure(name) for each of `names` over `rounds` rounds that measure each once, the order
    reversed every other round (`alternating`): a drift of the machine over the rounds (clocks, a busy compile pool)
    falls on every name alike, where measuring one after the other would hand it to whichever ran during it. A
    measurement that returns a string (a failure) is that name's result, and it is not measured again."""
    times: dict[str, list] = {name: [] for name in names}
    for name in alternating(list(names), rounds):
        if times[name] and isinstance(times[name][0], str):
            continue
        times[name].append(measure(name))
    return {name: values[0] if isinstance(values[0], str) else statistics.median(values)
            for name, values in times.items()}


def interleaved_median_ms(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median wall-clock milliseconds of each of `fns` (`wall_ms`) in alternating rounds (`interleaved_median`)."""
    with gc_frozen():
        return interleaved_median(lambda name: wall_ms(fns[name]), list(fns), rounds)


def per_step_ms(step: Callable[[int], object], steps: int, warm: int = 3) -> float:
    """Wall-clock ms a call of step(i) for i = warm .. steps - 1, after step(0 .. warm - 1) ran untimed (the first
    calls compile and record CUDA graphs); the device synchronized before and after the timed steps."""
    for i in range(warm):
        step(i)
    with gc_frozen():
        sync()
        start = time.perf_counter()
        for i in range(warm, steps):
            step(i)
        sync()
        return (time.perf_counter() - start) * 1e3 / (steps - warm)


def host_us_per_call(fn: Callable[[], object], calls: int = 200, repeats: int = 5) -> float:
    """Microseconds per call of back-to-back calls (no sync in between): the launch cost when the
    GPU work is tiny."""
    for _ in range(10):
        fn()
    with gc_frozen():
        return min(_back_to_back_us(fn, calls) for _ in range(repeats))


def _back_to_back_us(fn: Callable[[], object], calls: int) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls * 1e6
