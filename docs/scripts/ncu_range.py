"""The profiled range of our ncu scripts (`ncu --profile-from-start off`): each call run once outside it (compiles,
first-touch allocations), then once inside it, named by an NVTX range, in order."""

import torch


def profile_calls(calls: list, label: str = "profiled") -> None:
    """calls: (name, zero-argument callable) pairs."""
    for _, call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, call in calls:
        torch.cuda.nvtx.range_push(name)
        call()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"{label}, in order:", ", ".join(name for name, _ in calls))
