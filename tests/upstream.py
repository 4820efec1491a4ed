"""Attention code of upstream projects, each written once for every test that compiles it.

These are our own re-statements, not copies: each builds the graph shapes the upstream code hands Dynamo
(the same operations on the same kinds of values, in the same order), with the parts that do not reach
attention (rotary embeddings, configs, MLPs) left out. The docstrings say which upstream code and version
each follows, so a change upstream can be checked against them.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# ------------------------------------------------------------------------------------------------- gpt-fast


class KVCache(nn.Module):
    """gpt-fast's KV cache (pytorch-labs/gpt-fast `model.py`, main branch of 2024): two [B, H, capacity, D]
    buffers, written by `update` at the positions `input_pos` with an indexed assignment
    (`cache[:, :, input_pos] = new`), which returns the whole buffers (capacity keys, most not yet written)."""

    def __init__(self, batch: int, heads: int, capacity: int, head_dim: int):
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(batch, heads, capacity, head_dim))
        self.register_buffer("v_cache", torch.zeros(batch, heads, capacity, head_dim))

    def update(self, input_pos, k_val, v_val):
        keys, values = self.k_cache, self.v_cache
        keys[:, :, input_pos] = k_val
        values[:, :, input_pos] = v_val
        return keys, values


class Int8KVCache(nn.Module):
    """An int8 variant of gpt-fast's `KVCache` (above), as gpt-fast's int8 code is written (its
    `WeightOnlyInt8Linear`: int8 buffers, a scale buffer, `w.to(dtype)` times the scales): int8 `k_cache` /
    `v_cache` [B, H, capacity, D] and float32 `k_scales` / `v_scales` [B, H, capacity], one symmetric scale per
    (batch, head, token) over D (amax / 127, an all-zero row scale 0); `update` writes both at `input_pos` with
    indexed assignments and returns the whole caches dequantized in the new values' dtype:
    `k_cache.to(dtype) * k_scales[..., None].to(dtype)`."""

    def __init__(self, batch: int, heads: int, capacity: int, head_dim: int):
        super().__init__()
        for name in ("k", "v"):
            self.register_buffer(f"{name}_cache", torch.zeros(batch, heads, capacity, head_dim, dtype=torch.int8))
            self.register_buffer(f"{name}_scales", torch.zeros(batch, heads, capacity))

    @staticmethod
    def quantize(x):
        scales = x.float().abs().amax(-1) / 127
        values = (x.float() / scales.masked_fill(scales == 0, 1)[..., None]).round().clamp(-127, 127)
        return values.to(torch.int8), scales

    def update(self, input_pos, k_val, v_val):
        k, k_scales = self.quantize(k_val)
        v, v_scales = self.quantize(v_val)
        self.k_cache[:, :, input_pos] = k
        self.k_scales[:, :, input_pos] = k_scales
        self.v_cache[:, :, input_pos] = v
        self.v_scales[:, :, input_pos] = v_scales
        dtype = k_val.dtype
        return (self.k_cache.to(dtype) * self.k_scales[..., None].to(dtype),
                self.v_cache.to(dtype) * self.v_scales[..., None].to(dtype))


def gpt_fast_causal_mask(capacity: int) -> torch.Tensor:
    """gpt-fast's `causal_mask` buffer: a boolean lower triangle over the cache capacity; a forward reads its
    rows at the query positions, `causal_mask[None, None, input_pos]`."""
    return torch.tril(torch.ones(capacity, capacity, dtype=torch.bool))


def gpt_fast_sdpa(q, k, v, mask, n_rep: int):
    """The end of gpt-fast's `Attention.forward`: K/V heads repeated with `repeat_interleave` along dim 1 (GQA),
    then SDPA with the boolean mask. mask None: `is_causal=True` instead (our addition, for a forward without
    caches or positions; gpt-fast itself always passes its mask)."""
    k = k.repeat_interleave(n_rep, dim=1)
    v = v.repeat_interleave(n_rep, dim=1)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)


class GptFastCachedAttention(nn.Module):
    """gpt-fast's cached attention on given q, k, v (`Transformer.forward`'s mask and `Attention.forward` from
    the cache update on, same source): `kv_cache` (a `KVCache` or an `Int8KVCache`) written at `input_pos`, the
    bool mask `causal_mask[None, None, input_pos]` over its capacity, then `gpt_fast_sdpa` with K/V heads
    repeated `n_rep` times."""

    def __init__(self, kv_cache: nn.Module, n_rep: int):
        super().__init__()
        self.kv_cache, self.n_rep = kv_cache, n_rep
        self.register_buffer("causal_mask", gpt_fast_causal_mask(kv_cache.k_cache.shape[2]))

    def forward(self, q, k, v, input_pos):
        mask = self.causal_mask[None, None, input_pos]
        k_all, v_all = self.kv_cache.update(input_pos, k, v)
        return gpt_fast_sdpa(q, k_all, v_all, mask, self.n_rep)


class GptFastAttention(nn.Module):
    """gpt-fast's `Attention` (same source): one fused `wqkv` projection split into q, k, v of n_head and
    n_local_heads heads, [B, S, H, D] views transposed to [B, H, S, D], the KV cache (when `capacity` is given,
    as `setup_caches` would) updated at `input_pos`, `gpt_fast_sdpa`, and `wo` over the merged heads. Rotary
    embeddings are left out."""

    def __init__(self, dim=64, n_head=8, n_local_heads=2, batch=None, capacity=None):
        super().__init__()
        self.head_dim, self.n_head, self.n_local_heads = dim // n_head, n_head, n_local_heads
        self.wqkv = nn.Linear(dim, (n_head + 2 * n_local_heads) * self.head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.kv_cache = KVCache(batch, n_local_heads, capacity, self.head_dim) if capacity is not None else None

    def forward(self, x, mask=None, input_pos=None):
        bsz, seqlen, _ = x.shape
        kv_size = self.n_local_heads * self.head_dim
        q, k, v = self.wqkv(x).split([self.n_head * self.head_dim, kv_size, kv_size], dim=-1)
        q = q.view(bsz, seqlen, self.n_head, self.head_dim)
        k = k.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        v = v.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(input_pos, k, v)
        y = gpt_fast_sdpa(q, k, v, mask, self.n_head // self.n_local_heads)
        return self.wo(y.transpose(1, 2).contiguous().view(bsz, seqlen, -1))


class GptFastDecoder(nn.Module):
    """gpt-fast's `Transformer.forward` (same source), its attention path only: the `causal_mask` buffer's
    rows picked by `input_pos` once, and handed to every layer with the positions; residual adds stand in for
    the blocks (no norms, no MLP, no embeddings)."""

    def __init__(self, dim=64, n_head=4, n_local_heads=2, layers=2, batch=2, capacity=32):
        super().__init__()
        self.layers = nn.ModuleList(GptFastAttention(dim, n_head, n_local_heads, batch, capacity)
                                    for _ in range(layers))
        self.register_buffer("causal_mask", gpt_fast_causal_mask(capacity))

    def forward(self, x, input_pos):
        mask = self.causal_mask[None, None, input_pos]
        for layer in self.layers:
            x = x + layer(x, mask, input_pos)
        return x


class WeightOnlyInt8Linear(nn.Module):
    """gpt-fast's `WeightOnlyInt8Linear` (pytorch-labs/gpt-fast `quantize.py`, main branch of 2024): an int8
    `weight` [out, in] buffer and a `scales` [out] buffer in the model's dtype; the forward casts the weight
    to the input's dtype, runs `F.linear` without bias and multiplies the output by the scales.
    `from_linear` quantizes as gpt-fast's `WeightOnlyInt8QuantHandler` does: symmetric per output channel,
    scale = max |w| / 127 over the row, rounded to the nearest int8 and clamped to -128..127."""

    def __init__(self, in_features: int, out_features: int, dtype=torch.bfloat16):
        super().__init__()
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.ones(out_features, dtype=dtype))

    @classmethod
    def from_linear(cls, linear: nn.Linear, dtype=torch.bfloat16) -> "WeightOnlyInt8Linear":
        w = linear.weight.detach().float()
        scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-5)
        module = cls(w.shape[1], w.shape[0], dtype)
        module.weight.copy_((w / scales[:, None]).round().clamp(-128, 127).to(torch.int8))
        module.scales.copy_(scales.to(dtype))
        return module

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(input, self.weight.to(dtype=input.dtype)) * self.scales


# --------------------------------------------------------------------------------------------------- nanoGPT


class CausalSelfAttention(nn.Module):
    """nanoGPT's `CausalSelfAttention` (karpathy/nanoGPT `model.py`, 2023): one `c_attn` projection split
    into q, k, v, heads as [B, H, T, D], then either SDPA with `is_causal=True` (`flash`, what nanoGPT uses
    when torch has SDPA) or the hand-written path: scores scaled by 1/sqrt(D), `masked_fill` where the
    registered lower-triangular `bias` buffer [1, 1, block, block], sliced to [:, :, :T, :T], is 0, softmax,
    `attn_dropout`, times v; then `c_proj` and `resid_dropout` over the merged heads. Keyword arguments stand
    in for its config."""

    def __init__(self, n_embd=32, n_head=2, block_size=16, dropout=0.1, flash=False):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.dropout, self.flash = n_head, dropout, flash
        if not flash:
            tril = torch.tril(torch.ones(block_size, block_size))
            self.register_buffer("bias", tril.view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = self.attend(q, k, v)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))

    def attend(self, q, k, v):
        """The attention of [B, H, T, D] heads, either way."""
        if self.flash:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                                  dropout_p=self.dropout if self.training else 0, is_causal=True)
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        return att @ v


# -------------------------------------------------------------------------------------------- HF transformers


def repeat_kv(hidden_states: torch.Tensor, n_rep: int) -> torch.Tensor:
    """transformers' `repeat_kv` (models/llama/modeling_llama.py; checked against transformers 5.24):
    [B, Hkv, S, D] to [B, Hkv * n_rep, S, D] by a new axis after the heads, expanded n_rep times and reshaped
    into the heads (each K/V head's copies side by side, like `repeat_interleave`); the input itself when n_rep
    is 1."""
    batch, heads, seqlen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    expanded = hidden_states[:, :, None, :, :].expand(batch, heads, n_rep, seqlen, head_dim)
    return expanded.reshape(batch, heads * n_rep, seqlen, head_dim)


def causal_mask(q_idx: torch.Tensor, kv_idx: torch.Tensor, batch: int) -> torch.Tensor:
    """transformers' `masking_utils.sdpa_mask` with its `causal_mask_function` (checked against 5.24),
    vectorized: boolean [B, 1, Sq, Sk], key position kv_idx visible to query position q_idx when
    `kv_idx <= q_idx`."""
    return (kv_idx[None, None, None, :] <= q_idx[None, None, :, None]).expand(batch, -1, -1, -1)


def sliding_window_mask(q_idx: torch.Tensor, kv_idx: torch.Tensor, window: int) -> torch.Tensor:
    """transformers' sliding-window causal mask (`masking_utils`, `and_masks(sliding_window_overlay(W),
    causal_mask_function)`; checked against 5.24), vectorized: a boolean all-True start, and-ed with
    `kv_idx > q_idx - W` and `kv_idx <= q_idx`; [1, 1, Sq, Sk]."""
    q_idx, kv_idx = q_idx[None, None, :, None], kv_idx[None, None, None, :]
    return q_idx.new_ones((), dtype=torch.bool) & (kv_idx > q_idx - window) & (kv_idx <= q_idx)


def padding_mask(attention_mask: torch.Tensor, sq: int, sk: int) -> torch.Tensor:
    """transformers' `masking_utils.padding_mask_function` for a bidirectional encoder (checked against
    5.24), vectorized: the [B, L] attention_mask as booleans, read at `[batch_idx, kv_idx]` with batch_idx an
    arange over the batch laid along dim 0 and kv_idx an arange over the keys along the last dim, broadcast
    over the sq queries: [B, 1, Sq, Sk]."""
    keep = attention_mask.to(torch.bool)
    batch_idx = torch.arange(attention_mask.shape[0])[:, None, None, None]
    kv_idx = torch.arange(sk)[None, None, None, :]
    return keep[batch_idx, kv_idx].expand(-1, -1, sq, -1)


def update_causal_mask_4x(attention_mask: torch.Tensor, cache_position: torch.Tensor, target_length: int,
                          dtype: torch.dtype) -> torch.Tensor:
    """transformers 4's older `_update_causal_mask` (its `_prepare_4d_causal_attention_mask_with_cache_position`;
    checked against 4.57's OPT and BioGPT): a finfo.min triangle kept where a key lies past the query's cache
    position, cloned, and the [B, L] 0/1 attention_mask written over it in place, finfo.min where the triangle is
    0 and the key is padding: [B, 1, Sq, target_length], 0 where visible."""
    lowest = torch.finfo(dtype).min
    sq = cache_position.shape[0]
    mask = torch.full((sq, target_length), lowest, dtype=dtype)
    if sq != 1:
        mask = torch.triu(mask, diagonal=1)
    mask *= torch.arange(target_length) > cache_position.reshape(-1, 1)
    mask = mask[None, None, :, :].expand(attention_mask.shape[0], 1, -1, -1)
    mask = mask.clone()
    length = attention_mask.shape[-1]
    padding = (mask[:, :, :, :length] + attention_mask[:, None, None, :]) == 0
    mask[:, :, :, :length] = mask[:, :, :, :length].masked_fill(padding, lowest)
    return mask


def static_cache_update(k_cache, v_cache, k, v, cache_position):
    """transformers' `StaticCache` layer update (cache_utils; checked against 5.24): the new keys and
    values written in place with `index_copy_` along the sequence dim at `cache_position`; the whole buffers
    are the keys."""
    k_cache.index_copy_(2, cache_position, k)
    v_cache.index_copy_(2, cache_position, v)
    return k_cache, v_cache


def static_cache_attention(q, k, v, k_cache, v_cache, offset):
    """A transformers decoder layer's attention over a `StaticCache` (sdpa code; checked against 5.24):
    query positions `arange(Sq) + offset` (offset: a 0-d tensor that the caller advances in place, as HF's
    cache position), the causal mask over the whole cache capacity, the cache written at those positions, the
    offset advanced, `repeat_kv`, and SDPA with the mask."""
    sq, capacity = q.shape[2], k_cache.shape[2]
    q_pos = torch.arange(sq) + offset
    mask = causal_mask(q_pos, torch.arange(capacity), q.shape[0])
    keys, values = static_cache_update(k_cache, v_cache, k, v, q_pos)
    offset.add_(sq)
    group = q.shape[1] // k_cache.shape[1]
    return F.scaled_dot_product_attention(q, repeat_kv(keys, group), repeat_kv(values, group), attn_mask=mask)

