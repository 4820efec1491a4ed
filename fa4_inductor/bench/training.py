"""`train`: the Llama-1B-shaped HF model's training step (forward with labels, backward), default
torch.compile against ours: ms and peak memory."""

from __future__ import annotations

import functools

import torch

from . import padded
from .models import BACKENDS, llama
from .tables import Table, attempt, or_failed, speedup


def train_suite(device="cuda", dtype=torch.bfloat16, seqlen=4096, model_overrides=None):
    """Yields one table: a training step (forward with labels and `use_cache=False`, as training scripts
    call it, then backward) at batch 1, default torch.compile against ours, eager and sdpa attention code."""
    backends = BACKENDS
    table = Table("Llama-1B-shaped HF model, a training step (ms, lower is better)",
                  ["attention code", "tokens", *backends, "speedup", "peak GiB, default", "peak GiB, ours"],
                  note=f"{dtype}, batch 1, `model(ids, labels=ids, use_cache=False).loss.backward()` in train mode; "
                       "median of 5 after a compile; peak memory of the timed steps.")
    for attention in ("eager", "sdpa"):
        torch.manual_seed(0)
        model = llama(attention, device, dtype, **(model_overrides or {}))
        tokens = torch.randint(0, model.config.vocab_size, (1, seqlen), generator=torch.Generator().manual_seed(0))
        tokens = tokens.to(device)
        times, peaks = {}, {}
        for name, backend in backends.items():
            torch._dynamo.reset()
            if device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            times[name] = attempt(f"train {attention} {name}",
                                  functools.partial(padded.padded_ms, model, backend, tokens, None, True))
            peaks[name] = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
        base, ours = times.values()
        table.rows.append([attention, seqlen, or_failed(base), or_failed(ours), speedup(base, ours), *peaks.values()])
        del model
    torch._dynamo.reset()
    yield table
