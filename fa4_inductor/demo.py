"""A small Llama-style decoder (GQA, rotary, causal) and `python -m fa4_inductor demo`.

The attention is written two ways, as HF transformers writes it: "eager" (hand-written softmax with
`repeat_kv` and a causal mask built in the graph) and "sdpa" (`F.scaled_dot_product_attention`
with `repeat_kv` and `is_causal=True`). No downloads: weights are random.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class Config:
    vocab: int = 512
    dim: int = 256
    n_layers: int = 2
    n_heads: int = 8
    n_kv_heads: int = 2
    ffn_dim: int = 512
    attention: str = "sdpa"  # or "eager"
    rope_base: float = 10000.0


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    b, h, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.head_dim = cfg.dim // cfg.n_heads
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        n_rep = self.cfg.n_heads // self.cfg.n_kv_heads
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        if self.cfg.attention == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = torch.matmul(q, k.transpose(2, 3)) * self.head_dim**-0.5
            mask = torch.full((s, s), torch.finfo(scores.dtype).min, device=x.device, dtype=scores.dtype).triu(1)
            probs = F.softmax(scores + mask, dim=-1, dtype=torch.float32).to(q.dtype)
            out = torch.matmul(probs, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.dim)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.dim)
        self.gate = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.up = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.down = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TinyLlama(nn.Module):
    def __init__(self, cfg: Config = Config()):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.dim)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        s = tokens.shape[1]
        head_dim = self.cfg.dim // self.cfg.n_heads
        inv_freq = self.cfg.rope_base ** (-torch.arange(0, head_dim, 2, device=tokens.device).float() / head_dim)
        angles = torch.outer(torch.arange(s, device=tokens.device).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        x = self.embed(tokens)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def run(seq_len: int | None = None) -> int:
    """Compiles TinyLlama with both attention spellings; returns 0 when outputs match eager, else 1."""
    import fa4_inductor
    from fa4_inductor.bench.timing import interleaved_median_ms

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    seq_len = seq_len or (2048 if cuda else 64)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-4
    print(f"fa4_inductor demo on {device} ({torch.cuda.get_device_name() if cuda else 'CPU'}), {dtype}, "
          f"torch {torch.__version__}, batch 1, {seq_len} tokens")
    failures = 0
    for attention in ("eager", "sdpa"):
        torch.manual_seed(0)
        model = TinyLlama(Config(attention=attention)).to(device=device, dtype=dtype).eval()
        tokens = torch.randint(0, model.cfg.vocab, (1, seq_len), device=device)
        print(f"\n== attention written as {attention!r}")
        with torch.no_grad():
            fa4_inductor.explain(model, tokens)
            expected = model(tokens)
            compiled = torch.compile(model, backend=fa4_inductor)
            got = compiled(tokens)
            error = ((got.float() - expected.float()).abs().max() / expected.float().abs().max()).item()
            ok = math.isfinite(error) and error <= tolerance
            failures += not ok
            print(f"max error vs eager, relative to max |logit|: {error:.2e} ({'ok' if ok else 'MISMATCH'}, "
                  f"tolerance {tolerance:.0e})")
            if cuda:
                default = torch.compile(model)
                default(tokens)
                # Alternating rounds: a drift of the host over the timing falls on both compiles alike.
                times = interleaved_median_ms({"ours": lambda: compiled(tokens), "default": lambda: default(tokens)},
                                              rounds=20)
                ours, base = times["ours"], times["default"]
                print(f"forward: fa4_inductor {ours:.3f} ms, default torch.compile {base:.3f} ms ({base / ours:.2f}x)")
    return 1 if failures else 0
