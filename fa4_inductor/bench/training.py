"""`train`: the Llama-1B-shaped HF model's training step (forward with labels, backward), default
torch.compile against ours: ms and peak memory."""

from __future__ import annotations

import functools

import torch

from . import padded
from .models import BACKENDS, llama
from .tables import Table, attempt, or_failed, speedup


def train_suite(device="cuda", dtype=torch.bfloat16, seqlen=4096, model_overrides=None, losses=("labels", "logits mean")):
    """Yields one table: a training step (forward with `use_cache=False`, as training scripts call it, then
    backward) at batch 1, default torch.compile against ours, eager and sdpa attention code. The loss is HF's
    (`labels=`: a float32 cross-entropy over the vocabulary, the same cost on both backends) or the logits'
    mean (the model's own forward and backward)."""
    backends = BACKENDS
    table = Table("Llama-1B-shaped HF model, a training step (ms, lower is better)",
                  ["attention code", "loss", "tokens", *backends, "speedup", "peak GiB, default", "peak GiB, ours"],
                  note=f"{dtype}, batch 1, `model(ids, labels=ids, use_cache=False).loss.backward()` (loss: labels) or "
                       "`model(ids, use_cache=False).logits.mean().backward()` (logits mean) in train mode; "
                       "median of 5 after a compile; peak memory of the timed steps.")
    for attention, loss in ((a, loss) for a in ("eager", "sdpa") for loss in losses):
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
                                  functools.partial(padded.padded_ms, model, backend, tokens, None, True,
                                                    labels=loss == "labels"))
            peaks[name] = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
        base, ours = times.values()
        table.rows.append([attention, loss, seqlen, or_failed(base), or_failed(ours), speedup(base, ours), *peaks.values()])
        del model
    torch._dynamo.reset()
    yield table
