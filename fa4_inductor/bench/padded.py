"""`padded`: the Llama-1B-shaped HF model on a left-padded batch (the `attention_mask` generate passes) and a
right-padded one (fine-tuning) against the same batch without a mask, prefill and a training step, default
torch.compile against ours."""

from __future__ import annotations

import functools

import torch

from . import models, timing
from .models import BACKENDS, padded_batch, llama
from .tables import Table, attempt, or_failed, speedup


def static_cache_prefill(model, tokens, mask, capacity: int) -> dict:
    """The keyword arguments `generate(cache_implementation="static")` hands a compiled forward at a padded batch's
    prefill: a `StaticCache` of `capacity` slots and (transformers 5.24 builds it outside the forward) a
    [B, 1, S, capacity] mask, query i seeing the visible keys j <= i, the empty slots hidden: boolean for sdpa code,
    additive (0 visible, finfo.min hidden, the model's dtype) for eager code."""
    from transformers import StaticCache

    from ..hf import cache_keyword

    s = tokens.shape[1]
    slots = torch.arange(capacity, device=tokens.device)
    visible = torch.nn.functional.pad(mask.bool(), (0, capacity - s))
    causal = slots[None, :] <= torch.arange(s, device=tokens.device)[:, None]
    keep = (causal[None] & visible[:, None, :])[:, None]
    if model.config._attn_implementation == "eager":
        keep = torch.zeros(keep.shape, dtype=model.dtype, device=keep.device).masked_fill(
            ~keep, torch.finfo(model.dtype).min)
    return {"attention_mask": keep, cache_keyword(model): StaticCache(config=model.config, max_cache_len=capacity),
            "use_cache": True}


def padded_ms(model, backend_name, tokens, mask, train: bool, labels: bool = True, static_cache: int = 0,
              keep: list | None = None) -> float:
    """Median ms of a compiled forward (last-token logits) or of a training step (forward with labels, or
    without them the logits' mean as the loss; backward) of `model` on `tokens`, with `mask` as its
    attention_mask (None: no mask). `static_cache`: a prefill into a static cache of that many slots, as generate
    makes it (`static_cache_prefill`). `keep`: a list the last call's logits (prefill) or loss (train) is put in."""
    keep = [] if keep is None else keep
    model.train(train)
    if not train:
        compiled = models.compile_model(model, backend_name)
        kwargs = (static_cache_prefill(model, tokens, mask, static_cache) if static_cache
                  else {"attention_mask": mask})
        caches = [c for c in kwargs.values() if hasattr(c, "reset")]

        def prefill():
            for cache in caches:  # empty again, as generate's is: a prefill writes from the cache's length on
                cache.reset()
            keep[:] = [compiled(tokens, **kwargs, logits_to_keep=1).logits]

        with torch.no_grad():
            return timing.median_wall_ms(prefill, repeats=7)
    targets = tokens.masked_fill(mask == 0, -100) if mask is not None else tokens

    def step():
        model.zero_grad(set_to_none=True)
        if labels:
            loss = compiled(tokens, attention_mask=mask, labels=targets, use_cache=False).loss
        else:
            loss = compiled(tokens, attention_mask=mask, use_cache=False).logits.mean()
        loss.backward()
        keep[:] = [loss.detach()]

    compiled = models.compile_model(model, backend_name)
    return timing.median_wall_ms(step, repeats=5)


def padded_suite(device="cuda", dtype=torch.bfloat16, batch=4, seqlen=2048, pads=(0, 100, 700, 1500),
                 attentions=("sdpa", "eager"), passes=("prefill", "train"), sides=("left", "right"),
                 model_overrides=None):
    """Yields one table: a left-padded batch (the `attention_mask` generate passes) and a right-padded one (a
    fine-tuning batch) against the same batch without a mask, prefill and a training step, default torch.compile
    against ours."""
    backends = BACKENDS
    pads = [min(p * seqlen // 2048, seqlen - 1) for p in pads]
    table = Table("Llama-1B-shaped HF model, padded batches (ms, lower is better)",
                  ["attention code", "pass", "batch", *backends, "speedup"],
                  note=f"{dtype}, batch {batch} x {seqlen}, {pads} pad tokens on the left or the right "
                       "(`attention_mask`) or no mask; prefill: last-token logits, no_grad (static cache: into a "
                       f"StaticCache of {2 * seqlen} slots with the [B, 1, S, {2 * seqlen}] boolean mask generate "
                       "builds); train: forward with labels "
                       "(`use_cache=False`) + backward; median of 7 / 5 after a compile.")
    for attention in attentions:
        torch.manual_seed(0)
        model = llama(attention, device, dtype, **(model_overrides or {}))
        batches = {f"{side}-padded": padded_batch(model.config.vocab_size, batch, seqlen, pads, device, side)
                   for side in sides}
        for train in [p == "train" for p in passes]:
            kinds = [*batches.items(), ("no mask", (next(iter(batches.values()))[0], None))]
            if not train and "left-padded" in batches:
                kinds.insert(1, ("left-padded, static cache", batches["left-padded"]))
            for kind, (tokens, mask) in kinds:
                times = {}
                for name, backend in backends.items():
                    torch._dynamo.reset()
                    times[name] = attempt(f"padded {attention} {kind} {name}", functools.partial(
                        padded_ms, model, backend, tokens, mask, train,
                        static_cache=2 * seqlen if "static cache" in kind else 0))
                base, ours = times.values()
                table.rows.append([attention, "train" if train else "prefill", kind,
                                   or_failed(base), or_failed(ours), speedup(base, ours)])
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    torch._dynamo.reset()
    yield table
