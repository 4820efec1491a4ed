"""An int8 KV cache for HF transformers: `Int8StaticCache`, a `StaticCache` whose full-attention layers store K and V
as int8 with a float32 scale per (token, KV head), half the bytes a bfloat16 cache holds and decode reads.

    from fa4_inductor import Int8StaticCache
    cache = Int8StaticCache(config=model.config, max_cache_len=4096)
    model.generate(input_ids, past_key_values=cache, max_new_tokens=256)   # `cache=` where the model takes it
    model(input_ids, past_key_values=cache, use_cache=True)

Quantization (`quantize`): symmetric per (batch, KV head, token) over the head dim,

    scale = amax(|x|) / 127   (float32, computed from x in float32)
    q     = clamp(round(x / scale), -127, 127) as int8   (an all-zero row: scale 0, q 0)

written at the cache positions with `index_copy_`, as `StaticCache` writes. Reading (`update`'s return) dequantizes
the whole cache in plain PyTorch, `(q.float() * scale[..., None]).to(dtype)`: eager, CPU and
`torch.compile(fullgraph=True)` all run it; fa4_inductor's backend rewrites that dequantization feeding an
attention into `fa4::attention_int8kv`, which reads the int8 cache itself (lowering/int8_kv.py), so the compiled
step never writes the dequantized cache to memory.

Per-token scales keep the error of each key and value within half a step of its own row's largest entry:
|x - dequantized| <= scale / 2 = amax / 254 per entry.

What differs from `StaticCache`: the layers of full attention become `Int8StaticLayer`; sliding-window layers
(their caches are window-sized) and other layer kinds stay as transformers makes them. transformers has no
registry of `cache_implementation` names (generate builds `StaticCache` for "static" from a fixed list), so the
cache is passed as an object. Checked against transformers 4.57, 5.17, 5.24 and 5.25 (`StaticLayer.lazy_initialization`
and `get_layer_types_and_kwargs` differ between them; this module calls neither; 4.57's layers take the caller's
`cache_position` where 5's count their own length).
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

QMAX = 127
SCALE_DTYPE = torch.float32


def quantize(x: Tensor) -> tuple[Tensor, Tensor]:
    """(int8 values, float32 scales) of x [..., D]: symmetric, one scale per row over the last dim (module docstring)."""
    x = x.float()
    scale = x.abs().amax(-1) / QMAX
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (x / divisor[..., None]).round().clamp(-QMAX, QMAX).to(torch.int8), scale


def dequantize(x: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """x.float() * scale[..., None], cast to `dtype`: what the cache's attention reads."""
    return (x.float() * scale[..., None]).to(dtype)


class Int8StaticLayer(StaticLayer):
    """A `StaticLayer` holding int8 `keys` / `values` [B, Hkv, max_cache_len, D] and float32 `key_scales` /
    `value_scales` [B, Hkv, max_cache_len], allocated on the first update (or `early_initialization`) with the
    new states' batch, heads, device, and their dtype as the dtype `update` returns."""

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.batch_size, self.num_heads = key_states.shape[:2]
        self.k_head_dim, self.v_head_dim = key_states.shape[-1], value_states.shape[-1]
        rows = (self.batch_size, self.num_heads, self.max_cache_len)
        self.keys = torch.zeros(rows + (self.k_head_dim,), dtype=torch.int8, device=self.device)
        self.values = torch.zeros(rows + (self.v_head_dim,), dtype=torch.int8, device=self.device)
        self.key_scales = torch.zeros(rows, dtype=SCALE_DTYPE, device=self.device)
        self.value_scales = torch.zeros(rows, dtype=SCALE_DTYPE, device=self.device)
        counted = hasattr(self, "cumulative_length")  # transformers 5: the layer counts its length
        if counted:
            self.cumulative_length = self.cumulative_length.to(self.device)
        if not torch.compiler.is_compiling():  # fixed addresses: CUDA graphs and compiled steps update them in place
            for t in (self.keys, self.values, self.key_scales, self.value_scales) + \
                    ((self.cumulative_length,) if counted else ()):
                torch._dynamo.mark_static_address(t)
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, cache_kwargs: dict | None = None, *args,
               **kwargs) -> tuple[Tensor, Tensor]:
        """Quantize the new states into the cache at the next positions, in place; return the whole cache
        dequantized to the states' dtype (capacity keys, the unwritten ones zero). The positions: the layer's own
        count (transformers 5), or the caller's `cache_position` (transformers 4)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        kv_length = key_states.shape[-2]
        if hasattr(self, "cumulative_length"):
            cache_position = torch.arange(kv_length, device=self.device) + self.cumulative_length
            self.cumulative_length.add_(kv_length)
        else:
            given = cache_kwargs.get("cache_position") if isinstance(cache_kwargs, dict) else None
            cache_position = given if given is not None else torch.arange(kv_length, device=self.device)
        k, k_scale = quantize(key_states)
        v, v_scale = quantize(value_states)
        self.keys.index_copy_(2, cache_position, k)
        self.key_scales.index_copy_(2, cache_position, k_scale)
        self.values.index_copy_(2, cache_position, v)
        self.value_scales.index_copy_(2, cache_position, v_scale)
        return dequantize(self.keys, self.key_scales, self.dtype), dequantize(self.values, self.value_scales, self.dtype)

    def reset(self) -> None:
        super().reset()
        if self.is_initialized:
            self.key_scales.zero_()
            self.value_scales.zero_()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.get_seq_length() > 0:
            index = beam_idx.to(self.device)
            self.key_scales = self.key_scales.index_select(0, index)
            self.value_scales = self.value_scales.index_select(0, index)
        super().reorder_cache(beam_idx)

    def offload(self):
        super().offload()
        if self.is_initialized:
            self.key_scales = self.key_scales.to("cpu", non_blocking=True)
            self.value_scales = self.value_scales.to("cpu", non_blocking=True)

    def prefetch(self):
        super().prefetch()
        if self.is_initialized and self.key_scales.device != self.device:
            self.key_scales = self.key_scales.to(self.device, non_blocking=True)
            self.value_scales = self.value_scales.to(self.device, non_blocking=True)


class Int8StaticCache(StaticCache):
    """`StaticCache(config, max_cache_len, ...)` with int8 full-attention layers (`Int8StaticLayer`); the same
    arguments, and the same use: `generate(..., past_key_values=cache)`, `model(..., past_key_values=cache)`."""

    def __init__(self, config, max_cache_len: int, *args, **kwargs):
        super().__init__(config, max_cache_len, *args, **kwargs)
        self.layers = [Int8StaticLayer(max_cache_len=layer.max_cache_len) if type(layer) is StaticLayer else layer
                       for layer in self.layers]
