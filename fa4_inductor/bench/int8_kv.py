"""`int8kv` (only when named): long-context static-cache decode of the Llama-1B-shaped model (head dim 64) with a
bfloat16 `StaticCache` against `fa4_inductor.Int8StaticCache`, default torch.compile against our backend.

The cache is filled with random keys and values (no prefill: a batch of 8 x 32k prompts would cost minutes and
its logits tens of GB), then each configuration decodes `steps` tokens with its one-token step compiled under
`mode="reduce-overhead"`. Columns: ms per decode step (the batch's tokens), the K/V bytes a step reads from the
cache, and the first step's logits against the bfloat16 cache under default compile (relative to their
largest magnitude). Under default compile the int8 cache is dequantized into a bfloat16 copy per layer and step
(more bytes than the bfloat16 cache); ours reads the int8 cache in `fa4::attention_int8kv`.
"""

from __future__ import annotations

import functools

import torch

from . import models, timing
from .models import BACKENDS, llama
from .tables import Table, attempt, or_failed

CACHES = ("bf16", "int8")


def filled_cache(model, kind: str, batch: int, capacity: int, filled: int, device, seed: int = 0):
    """A `StaticCache` ("bf16") or `Int8StaticCache` ("int8") over `capacity` slots, the first `filled` written with
    random keys and values through the cache's own `update`, as a prefill would write them."""
    from transformers import StaticCache

    from ..int8_cache import Int8StaticCache

    config = model.config
    cache = (Int8StaticCache if kind == "int8" else StaticCache)(config=config, max_cache_len=capacity)
    heads, head_dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or head_dim
    generator = torch.Generator(device=device).manual_seed(seed)
    dtype = next(model.parameters()).dtype
    with torch.no_grad():
        for layer in range(config.num_hidden_layers):
            k, v = (torch.randn(batch, heads, filled, head_dim, device=device, dtype=dtype, generator=generator)
                    for _ in range(2))
            cache.update(k, v, layer)
    return cache


def kv_bytes_per_step(model, kind: str, batch: int, keys: int) -> int:
    """Bytes of cached K/V (and scales) one decode step reads over `keys` slots, all layers."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rows = config.num_hidden_layers * batch * config.num_key_value_heads * keys * 2  # K and V
    return rows * (head_dim + 4) if kind == "int8" else rows * head_dim * 2


def decode_ms(model, kind: str, backend_name: str, batch: int, capacity: int, steps: int, device,
              mode="reduce-overhead") -> tuple[float, torch.Tensor]:
    """(ms per decode step, the first step's logits [batch, vocab]) of greedy decoding from a cache filled up to
    `capacity - steps - 8` slots."""
    from ..hf import cache_keyword

    filled = capacity - steps - 8
    cache = {cache_keyword(model): filled_cache(model, kind, batch, capacity, filled, device)}

    def step(token, position):
        return model(token, position_ids=position, **cache, use_cache=True).logits[:, -1]

    compiled = models.compile_model(step, backend_name, mode=mode, fullgraph=True)
    token = torch.randint(0, model.config.vocab_size, (batch, 1), generator=torch.Generator().manual_seed(1)).to(device)
    position = torch.full((batch, 1), filled, device=device)
    state = {"token": token}

    def step(i):
        logits = compiled(state["token"].clone(), position.clone())
        if i == 0:
            state["first"] = logits.float().clone()
        state["token"] = logits.argmax(-1, keepdim=True)
        position.add_(1)

    with torch.no_grad():
        ms = timing.per_step_ms(step, steps)
    return ms, state["first"]


def int8_kv_suite(device="cuda", dtype=torch.bfloat16, batch=8, capacity=32768, steps=32, caches=CACHES,
                  backends=None, model_overrides=None) -> Table:
    """One row per (cache, backend): ms per decode step, K/V GB read per step, the first step's logits against the
    first configuration measured (the bfloat16 cache under default compile, unless `caches` / `backends` leave
    it out)."""
    backends = backends or BACKENDS
    torch.manual_seed(0)
    model = llama("sdpa", device, dtype, **(model_overrides or {}))
    table = Table(f"Llama-1B-shaped HF model (head dim 64), static-cache decode, batch {batch} x {capacity} cache: "
                  "bfloat16 against int8 K/V (ms per step, lower is better)",
                  ["cache", "backend", "ms / step", "KV GB / step", "KV TB/s", "logits vs the first row (relative)"],
                  note=f"{dtype}, sdpa attention code, greedy, the one-token step compiled with mode='reduce-overhead' "
                       f"(CUDA), {steps} steps from a cache filled with random K/V, first 3 excluded.")
    mode = "reduce-overhead" if device == "cuda" else "default"
    baseline = None
    for kind in caches:
        for name, backend in backends.items():
            torch._dynamo.reset()
            result = attempt(f"int8kv {kind} {name}", functools.partial(
                decode_ms, model, kind, backend, batch, capacity, steps, device, mode=mode))
            ms, logits = result or (None, None)
            if baseline is None and logits is not None:
                baseline = logits
                table.columns[-1] = f"logits vs {kind} {name} (relative)"
            gb = kv_bytes_per_step(model, kind, batch, capacity) / 1e9
            difference = "n/a" if logits is None or baseline is None else \
                f"{((logits - baseline).abs().max() / baseline.abs().max()).item():.1e}"
            rate = "n/a" if ms is None else f"{gb / ms:.2f}"
            table.rows.append([kind, name, or_failed(ms), f"{gb:.2f}", rate, difference])
            if device == "cuda":
                torch.cuda.empty_cache()
    torch._dynamo.reset()
    return table
