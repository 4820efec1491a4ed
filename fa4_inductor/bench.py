"""`python -m fa4_inductor bench`: the GPU benchmarks behind `docs/benchmarks.md`.

Suites (`--suite`, comma-separated; all by default):
- `op`: prefill attention, `fa4::attention` against FA4 called directly (`flash_attn_func`) and SDPA
  (cuDNN and flash backends), 16k tokens per batch over sequence lengths 1k..16k, head dims 64 / 128,
  causal and not; TFLOP/s from GPU time (`triton.testing.do_bench`, median).
- `overhead`: host cost per call of a tiny attention (the GPU is idle, so launches are the limit):
  FA4 directly, our adapter (`kernels/fa4.forward`), the `fa4::attention` op, and a compiled SDPA
  call under our backend and under default `torch.compile`.
- `decode`: one query token against a KV cache (GQA), `fa4::attention` (whichever kernel it picks)
  against SDPA `enable_gqa` and FA4 directly; GPU time under a CUDA graph, as TB/s of K/V read.
- `e2e`: a Llama-1B-shaped HF transformers model (hidden 2048, 16 layers, 32 query / 8 KV heads,
  bf16, random weights) with `attn_implementation` "eager" and "sdpa": prefill latency at 2k / 8k
  tokens, and decode tokens/s with a static cache under `mode="reduce-overhead"`, default
  `torch.compile` against `backend=fa4_inductor`.
- `generate`: the same model through HF's own `generate(cache_implementation="static")`, which
  compiles the decode step itself (`CompileConfig(backend=...)`, its default `reduce-overhead`
  mode): a left-padded batch of 4, time to first token (prefill with the padding mask) and decode
  tokens/s, default `torch.compile` against our backend.
- `padded`: the same model on a left-padded batch of 4 x 2048 (0/100/700/1500 pad tokens, the
  `attention_mask` generate passes) and on that batch without a mask: prefill and a training step
  (`use_cache=False`, labels, backward), default `torch.compile` against ours.
- `train`: the same model's training step at batch 1 x 4096 tokens (`use_cache=False`, labels,
  backward), eager and sdpa attention code: ms and peak memory, default `torch.compile` against ours.

Results print as markdown tables; `--out FILE` writes them (with the date, GPU, versions and the
command) and `--plot FILE.png` draws the op suite. Functions here take a `device` so the CPU test
suite can run them on tiny shapes; numbers only mean something on a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

SUITES = ("op", "overhead", "decode", "e2e", "generate", "padded", "train")


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list] = field(default_factory=list)
    note: str = ""

    def markdown(self) -> str:
        def cell(x):
            return f"{x:.3g}" if isinstance(x, float) and abs(x) < 100 else (f"{x:.0f}" if isinstance(x, float) else str(x))

        lines = [f"### {self.title}", ""]
        if self.note:
            lines += [self.note, ""]
        lines += ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in self.rows]
        return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------- timing


def gpu_ms(fn: Callable[[], object], cuda_graph: bool = False) -> float:
    """Median GPU milliseconds of `fn` (L2 flushed between runs); under a CUDA graph if asked."""
    if not torch.cuda.is_available():
        return _host_ms(fn)
    from triton.testing import do_bench, do_bench_cudagraph

    fn()  # compile / warm up outside the graph
    torch.cuda.synchronize()
    if cuda_graph:
        return do_bench_cudagraph(fn, rep=50, return_mode="median")
    return do_bench(fn, warmup=10, rep=50, return_mode="median")


def _host_ms(fn: Callable[[], object], repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        _sync()
        start = time.perf_counter()
        fn()
        _sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def host_us_per_call(fn: Callable[[], object], calls: int = 200, repeats: int = 5) -> float:
    """Microseconds per call of back-to-back calls (no sync in between): the launch cost when the
    GPU work is tiny."""
    for _ in range(10):
        fn()
    best = math.inf
    for _ in range(repeats):
        _sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


# -------------------------------------------------------------------------------------- op suites


def _hf_qkv(b, sq, sk, hq, hkv, d, dtype, device):
    """q, k, v as HF hands them to attention: [B, H, S, D] views of contiguous [B, S, H, D]."""
    def make(s, h):
        return torch.randn(b, s, h, d, dtype=dtype, device=device).transpose(1, 2)

    return make(sq, hq), make(sk, hkv), make(sk, hkv)


def _fa4_direct():
    """FA4's public `flash_attn_func` over [B, S, H, D] tensors, or None when FA4 is not importable."""
    from fa4_inductor.kernels import fa4

    interface, _ = fa4._interface()
    if interface is None:
        return None

    def call(q, k, v, causal, scale):
        return interface.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         softmax_scale=scale, causal=causal)
    return call


def _sdpa(backend):
    from torch.nn.attention import sdpa_kernel

    def call(q, k, v, causal, scale):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                  enable_gqa=q.shape[1] != k.shape[1])
    return call


def _ours(q, k, v, causal, scale):
    return torch.ops.fa4.attention(q, k, v, scale=scale, causal=causal)


def attention_impls(device) -> dict[str, Callable]:
    from torch.nn.attention import SDPBackend

    impls = {"fa4::attention": _ours}
    direct = _fa4_direct() if device == "cuda" else None
    if direct is not None:
        impls["FA4 direct"] = direct
    if device == "cuda":
        impls["SDPA cuDNN"] = _sdpa(SDPBackend.CUDNN_ATTENTION)
        impls["SDPA flash"] = _sdpa(SDPBackend.FLASH_ATTENTION)
    else:
        impls["SDPA math"] = _sdpa(SDPBackend.MATH)
    return impls


def op_suite(device="cuda", dtype=torch.bfloat16, seqlens=(1024, 2048, 4096, 8192, 16384), head_dims=(64, 128),
             tokens=16384, width=2048) -> Table:
    """Prefill TFLOP/s; batch = tokens // seqlen, heads = width // head_dim (FA's benchmark shapes)."""
    impls = attention_impls(device)
    table = Table("Prefill attention, TFLOP/s (higher is better)",
                  ["head dim", "causal", "seqlen", "batch x heads", *impls, "ours / FA4 direct"],
                  note=f"{dtype}, {tokens} tokens per batch, heads = {width} / head dim, q/k/v as HF's "
                       "[B, H, S, D] views of [B, S, H, D]; GPU time, median, L2 flushed.")
    for d in head_dims:
        for causal in (False, True):
            for s in seqlens:
                b, h = max(1, tokens // s), width // d
                q, k, v = _hf_qkv(b, s, s, h, h, d, dtype, device)
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                results = {}
                for name, impl in impls.items():
                    try:
                        ms = gpu_ms(lambda: impl(q, k, v, causal, d ** -0.5))
                        results[name] = flops / ms / 1e9
                    except Exception as e:  # a backend that does not take the shape
                        print(f"  {name} d{d} s{s} causal={causal}: {type(e).__name__}: {e}", file=sys.stderr)
                        results[name] = float("nan")
                ratio = results["fa4::attention"] / results.get("FA4 direct", float("nan"))
                table.rows.append([d, causal, s, f"{b}x{h}", *results.values(), ratio])
                del q, k, v
    return table


def overhead_suite(device="cuda", dtype=torch.bfloat16) -> Table:
    """Host microseconds per call for a tiny attention (b1, h8, s128, d64, causal)."""
    import fa4_inductor
    from fa4_inductor.kernels import fa4

    q, k, v = _hf_qkv(1, 128, 128, 8, 8, 64, dtype, device)
    scale = 64 ** -0.5
    calls = {"fa4::attention op": lambda: _ours(q, k, v, True, scale)}
    direct = _fa4_direct() if device == "cuda" else None
    if direct is not None:
        calls = {"FA4 flash_attn_func": lambda: direct(q, k, v, True, scale),
                 "our adapter (kernels/fa4.forward)": lambda: fa4.forward(q, k, v, scale=scale, causal=True),
                 **calls}

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    torch._dynamo.reset()
    calls["compiled SDPA, backend=fa4_inductor"] = _bind(torch.compile(sdpa, backend=fa4_inductor), q, k, v)
    calls["compiled SDPA, default torch.compile"] = _bind(torch.compile(sdpa), q, k, v)
    table = Table("Host overhead per attention call, microseconds (lower is better)", ["call", "us / call"],
                  note=f"b1 h8 s128 d64 causal {dtype}: the kernels are tiny, so back-to-back calls measure "
                       "the host path (best of 5 rounds of 200 calls).")
    for name, call in calls.items():
        with torch.no_grad():
            table.rows.append([name, host_us_per_call(call)])
    return table


def _bind(fn, *args):
    return lambda: fn(*args)


def decode_suite(device="cuda", dtype=torch.bfloat16, batches=(1, 8, 64), cache_lens=(4096, 32768, 131072),
                 heads=((32, 8), (64, 8)), head_dims=(128, 64), max_kv_gib=40.0) -> Table:
    """One new token against a full KV cache: GPU time under a CUDA graph, TB/s of K/V bytes."""
    impls = {"fa4::attention": _ours}
    direct = _fa4_direct() if device == "cuda" else None
    if direct is not None:
        impls["FA4 direct"] = direct
    impls["SDPA enable_gqa"] = _sdpa_default
    table = Table("Decode attention (1 query token), TB/s of K/V read (us in brackets)",
                  ["hq/hkv", "head dim", "batch", "cache", *impls],
                  note=f"{dtype}, contiguous [B, H, S, D] caches (HF static cache layout), CUDA-graph "
                       "replay, median.")
    for hq, hkv in heads:
        for d in head_dims:
            for b in batches:
                for sk in cache_lens:
                    kv_bytes = 2 * b * hkv * sk * d * torch.tensor([], dtype=dtype).element_size()
                    if kv_bytes > max_kv_gib * 2**30:
                        continue
                    q = torch.randn(b, hq, 1, d, dtype=dtype, device=device)
                    k = torch.randn(b, hkv, sk, d, dtype=dtype, device=device)
                    v = torch.randn(b, hkv, sk, d, dtype=dtype, device=device)
                    cells = []
                    for name, impl in impls.items():
                        try:
                            ms = gpu_ms(lambda: impl(q, k, v, False, d ** -0.5), cuda_graph=device == "cuda")
                            cells.append(f"{kv_bytes / ms / 1e9:.2f} ({ms * 1e3:.0f})")
                        except Exception as e:
                            print(f"  {name} b{b} sk{sk}: {type(e).__name__}: {e}", file=sys.stderr)
                            cells.append("n/a")
                    table.rows.append([f"{hq}/{hkv}", d, b, sk, *cells])
                    del q, k, v
    return table


def decode_kernel_comparison(b: int = 1, sk: int = 32768, hq: int = 32, hkv: int = 8, d: int = 128, *,
                             q_len: int = 1, dtype: torch.dtype = torch.bfloat16, causal: bool = True,
                             seqused: bool = False, splits: int | None = None, graphs: bool = True) -> dict:
    """Our decode kernel (`kernels/decode.py`, called directly, `splits` forcing its split count) against
    SDPA `enable_gqa`, our FA4 adapter and `fa4::attention` (`op`: whichever kernel it routes the call to)
    on one shape, for `tests/bench_decode.py` and the kernel's tuning.

    Inputs as HF static caches hand them over: K / V contiguous [B, Hkv, Sk, D], q [B, Hq, Sq, D]. With
    `seqused`, per-sequence lengths are given (all Sk) and two more rows run: SDPA with the equivalent mask
    over the cache (`sdpa_mask`), and our kernel with that mask as its key mask (`decode_key_mask`).
    Medians in ms (`*_ms`, CUDA-graph replay when `graphs`), TB/s of K/V (`*_tbps`)."""
    from fa4_inductor.kernels import decode, fa4

    device = "cuda"
    q = torch.randn(b, hq, q_len, d, dtype=dtype, device=device)
    k = torch.randn(b, hkv, sk, d, dtype=dtype, device=device)
    v = torch.randn(b, hkv, sk, d, dtype=dtype, device=device)
    used = torch.full((b,), sk, dtype=torch.int32, device=device) if seqused else None
    scale = d ** -0.5
    kv_bytes = 2 * k.numel() * k.element_size()
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    n_splits = splits or decode.num_splits(b, hkv, q_len, hq // hkv, sk, d, sms)
    decode.warmup(dtype, d, hq // hkv, q_len, device, causal=causal, seqused_k=seqused, key_mask=None if seqused else False)

    def sdpa():  # SDPA's causal mask is top-left aligned: for one query token it would hide all but key 0
        return _sdpa_default(q, k, v, causal and q_len > 1 and q_len == sk, scale)

    fns = {"decode": lambda: decode.forward(q, k, v, used, scale=scale, causal=causal, splits=n_splits), "sdpa": sdpa,
           "op": lambda: torch.ops.fa4.attention(q, k, v, used, scale=scale, causal=causal)}
    if seqused:
        key_mask = torch.arange(sk, device=device) < used[:, None]
        fns["sdpa_mask"] = lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=key_mask[:, None, None, :], scale=scale, enable_gqa=True)
        fns["decode_key_mask"] = lambda: decode.forward(q, k, v, used, key_mask, scale=scale, causal=causal,
                                                        splits=n_splits)
    try:
        if fa4.unsupported_reason(q, k, v, seqused_k=used, scale=scale, causal=causal) is None:
            fns["fa4"] = lambda: fa4.forward(q, k, v, used, scale=scale, causal=causal)
    except Exception:  # FA4 missing or broken: compare with SDPA only
        pass

    result = {"b": b, "sk": sk, "hq": hq, "hkv": hkv, "d": d, "q_len": q_len, "splits": n_splits,
              "kv_mb": kv_bytes / 1e6}
    for name, fn in fns.items():
        ms = gpu_ms(fn, cuda_graph=graphs)
        result[f"{name}_ms"] = ms
        result[f"{name}_tbps"] = kv_bytes / (ms * 1e-3) / 1e12
    if not causal or q_len == 1:
        result["max_abs_diff_vs_sdpa"] = (fns["decode"]()[0] - sdpa()).abs().max().item()
    return result


def _sdpa_default(q, k, v, causal, scale):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


# ------------------------------------------------------------------------------------------ e2e


LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256, max_position_embeddings=16384, rope_theta=500000.0,
                tie_word_embeddings=True)


def llama(attention: str, device, dtype, **overrides):
    """A Llama-1B-shaped `LlamaForCausalLM` (random weights) with the given attn_implementation."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{**LLAMA_1B, **overrides})
    config._attn_implementation = attention
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def _compile(model_fn, backend_name, **kwargs):
    import fa4_inductor

    if backend_name == "fa4_inductor":
        return torch.compile(model_fn, backend=fa4_inductor, **kwargs)
    return torch.compile(model_fn, **kwargs)


def prefill_ms(model, backend_name, seqlens, device) -> dict[int, float]:
    """Forward latency of the compiled model per prompt length (batch 1, last-token logits as
    `generate` asks for them in prefill)."""
    compiled = _compile(model, backend_name, dynamic=True)
    out = {}
    with torch.no_grad():
        for s in seqlens:
            tokens = torch.randint(0, model.config.vocab_size, (1, s), device=device)
            out[s] = _host_ms(lambda: compiled(tokens, logits_to_keep=1), repeats=7)
    return out


def decode_tokens_per_s(model, backend_name, prompt: int, steps: int, device, mode="reduce-overhead") -> tuple[float, torch.Tensor]:
    """Greedy decode with a static cache: the one-token forward compiled with `mode`; tokens/s and the
    logits of every step (a random model's logits are near ties, so tokens alone compare badly)."""
    from transformers import StaticCache

    from .hf import cache_keyword

    cache = {cache_keyword(model): StaticCache(config=model.config, max_cache_len=prompt + steps + 8)}
    tokens = torch.randint(0, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(0)).to(device)

    def step(token, position):
        return model(token, position_ids=position, **cache, use_cache=True).logits[:, -1]

    compiled = _compile(step, backend_name, mode=mode, fullgraph=True) if mode != "eager" else step
    with torch.no_grad():
        logits = model(tokens, position_ids=torch.arange(prompt, device=device)[None], **cache,
                       use_cache=True).logits[:, -1]
        token, seen = logits.argmax(-1), [logits.float()]
        position = torch.tensor([[prompt]], device=device)
        warm = 3
        for i in range(steps):
            if i == warm:
                _sync()
                start = time.perf_counter()
            logits = compiled(token[:, None].clone(), position.clone())
            token = logits.argmax(-1)
            seen.append(logits.float())
            position += 1
        _sync()
        elapsed = time.perf_counter() - start
    return (steps - warm) / elapsed, torch.stack(seen)


def _attempt(what: str, fn):
    """fn(), or None after printing why it failed: one broken measurement must not cost the others."""
    try:
        return fn()
    except Exception as e:  # reported in the table and on stderr, never hidden
        import traceback

        print(f"  {what} failed: {type(e).__name__}: {e}", file=sys.stderr)
        traceback.print_exc(file=sys.stderr)
        return None


def _ratio(base, ours, invert=False) -> str:
    if base is None or ours is None:
        return "n/a"
    return f"{(ours / base if invert else base / ours):.2f}x"


def e2e_suite(device="cuda", dtype=torch.bfloat16, seqlens=(2048, 8192), prompt=2048, steps=64,
              model_overrides=None):
    """Yields the prefill table, then the decode table (each as soon as it is measured)."""
    backends = {"default torch.compile": "inductor", "fa4_inductor": "fa4_inductor"}
    models = {}
    for attention in ("eager", "sdpa"):
        torch.manual_seed(0)
        models[attention] = llama(attention, device, dtype, **(model_overrides or {}))

    prefill = Table("Llama-1B-shaped HF model, prefill latency (ms, lower is better)",
                    ["attention code", "tokens", *backends, "speedup"],
                    note=f"{dtype}, batch 1, last-token logits (`logits_to_keep=1`, as `generate` runs prefill), "
                         "compiled with dynamic=True; median of 7 forwards.")
    for attention, model in models.items():
        times = {}
        for name, backend in backends.items():
            torch._dynamo.reset()
            times[name] = _attempt(f"prefill {attention} {name}", lambda: prefill_ms(model, backend, seqlens, device))
        for s in seqlens:
            base, ours = (None if times[name] is None else times[name][s] for name in backends)
            prefill.rows.append([attention, s, "failed" if base is None else base, "failed" if ours is None else ours,
                                 _ratio(base, ours)])
    yield prefill

    decode = Table("Llama-1B-shaped HF model, decode with a static cache (tokens/s, higher is better)",
                   ["attention code", "prompt", *backends, "speedup", "logits differ by (relative)"],
                   note=f"{dtype}, batch 1, greedy, the one-token step compiled with mode='reduce-overhead'; "
                        f"{steps} steps, first 3 excluded.")
    mode = "reduce-overhead" if device == "cuda" else "default"
    for attention, model in models.items():
        results = {}
        for name, backend in backends.items():
            torch._dynamo.reset()
            results[name] = _attempt(f"decode {attention} {name}",
                                     lambda: decode_tokens_per_s(model, backend, prompt, steps, device, mode=mode))
        (base_rate, base_logits), (rate, logits) = (results[name] or (None, None) for name in backends)
        difference = "n/a"
        if base_logits is not None and logits is not None:  # the first steps, before greedy choices can diverge
            difference = f"{((logits[:2] - base_logits[:2]).abs().max() / base_logits[:2].abs().max()).item():.1e}"
        decode.rows.append([attention, prompt, "failed" if base_rate is None else base_rate,
                            "failed" if rate is None else rate, _ratio(base_rate, rate, invert=True), difference])
    yield decode
    models.clear()
    torch._dynamo.reset()
    if device == "cuda":
        torch.cuda.empty_cache()


def generate_times(model, backend_name, prompt: int, new_tokens: int, batch: int, device):
    """(ms to the first token, decode tokens/s, scores [new_tokens, batch, vocab]) of HF `generate` with a
    static cache, HF compiling the decode step with `backend_name`; rows after the first are left-padded
    by a quarter of the prompt, as `generate` wants batches padded."""
    from transformers import CompileConfig

    import fa4_inductor

    config = CompileConfig(backend=fa4_inductor if backend_name == "fa4_inductor" else backend_name)
    config._compile_all_devices = True  # HF compiles on GPUs only; the CPU tests run this too
    tokens = torch.randint(1, model.config.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(tokens)
    mask[1:, : prompt // 4] = 0
    kwargs = dict(attention_mask=mask.to(device), do_sample=False, cache_implementation="static", pad_token_id=0,
                  return_dict_in_generate=True, output_scores=True)
    tokens = tokens.to(device)
    model.generation_config.compile_config = config
    try:
        with torch.no_grad():
            model.generate(tokens, max_new_tokens=new_tokens, **kwargs)  # compiles
            first = _host_ms(lambda: model.generate(tokens, max_new_tokens=1, **kwargs), repeats=3)
            whole = _host_ms(lambda: model.generate(tokens, max_new_tokens=new_tokens, **kwargs), repeats=3)
            scores = torch.stack(model.generate(tokens, max_new_tokens=new_tokens, **kwargs).scores).float()
    finally:
        model.generation_config.compile_config = None
    return first, batch * (new_tokens - 1) / max(whole - first, 1e-6) * 1e3, scores


def generate_suite(device="cuda", dtype=torch.bfloat16, prompt=1024, new_tokens=64, batch=4, model_overrides=None):
    backends = {"default torch.compile": "inductor", "fa4_inductor": "fa4_inductor"}
    table = Table("Llama-1B-shaped HF model, `generate(cache_implementation=\"static\")` (HF compiles the decode step)",
                  ["attention code", "prompt", "first token ms, default", "first token ms, ours",
                   "tokens/s, default", "tokens/s, ours", "speedup", "first scores differ by (relative)"],
                  note=f"{dtype}, batch {batch} (rows after the first left-padded by a quarter of the prompt), greedy, "
                       f"{new_tokens} new tokens; tokens/s counts every row, from generate({new_tokens}) - generate(1).")
    for attention in ("eager", "sdpa"):
        torch.manual_seed(0)
        model = llama(attention, device, dtype, **(model_overrides or {}))
        results = {}
        for name, backend in backends.items():
            torch._dynamo.reset()
            results[name] = _attempt(f"generate {attention} {name}",
                                     lambda: generate_times(model, backend, prompt, new_tokens, batch, device))
        (base_first, base_rate, base_scores), (first, rate, scores) = (
            results[name] or (None, None, None) for name in backends)
        difference = "n/a"
        if base_scores is not None and scores is not None:  # the first step, before greedy choices can diverge
            difference = f"{((scores[0] - base_scores[0]).abs().max() / base_scores[0].abs().max()).item():.1e}"
        table.rows.append([attention, prompt, *("failed" if x is None else x for x in (base_first, first, base_rate, rate)),
                           _ratio(base_rate, rate, invert=True), difference])
        del model
    yield table
    torch._dynamo.reset()


def left_padded_batch(vocab: int, batch: int, seqlen: int, pads, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of a left-padded batch, row b starting after pads[b] pad tokens."""
    tokens = torch.randint(1, vocab, (batch, seqlen), generator=torch.Generator().manual_seed(0)).to(device)
    mask = (torch.arange(seqlen)[None, :] >= torch.tensor(pads)[:, None]).long().to(device)
    return tokens, mask


def padded_ms(model, backend_name, tokens, mask, train: bool) -> float:
    """Median ms of a compiled forward (last-token logits) or of a training step (forward with labels,
    backward) of `model` on `tokens`, with `mask` as its attention_mask (None: no mask)."""
    model.train(train)
    if not train:
        compiled = _compile(model, backend_name)
        with torch.no_grad():
            return _host_ms(lambda: compiled(tokens, attention_mask=mask, logits_to_keep=1), repeats=7)
    labels = tokens.masked_fill(mask == 0, -100) if mask is not None else tokens

    def step():
        model.zero_grad(set_to_none=True)
        compiled(tokens, attention_mask=mask, labels=labels, use_cache=False).loss.backward()

    compiled = _compile(model, backend_name)
    return _host_ms(step, repeats=5)


def padded_suite(device="cuda", dtype=torch.bfloat16, batch=4, seqlen=2048, pads=(0, 100, 700, 1500),
                 attentions=("sdpa", "eager"), passes=("prefill", "train"), model_overrides=None):
    """Yields one table: a left-padded batch (the `attention_mask` generate passes) against the same batch
    without a mask, prefill and a training step, default torch.compile against ours."""
    backends = {"default torch.compile": "inductor", "fa4_inductor": "fa4_inductor"}
    pads = [min(p * seqlen // 2048, seqlen - 1) for p in pads]
    table = Table("Llama-1B-shaped HF model, a left-padded batch (ms, lower is better)",
                  ["attention code", "pass", "batch", *backends, "speedup"],
                  note=f"{dtype}, batch {batch} x {seqlen}, left padding {pads} tokens (`attention_mask`) or no mask; "
                       "prefill: last-token logits, no_grad; train: forward with labels (`use_cache=False`) + "
                       "backward; median of 7 / 5 after a compile.")
    for attention in attentions:
        torch.manual_seed(0)
        model = llama(attention, device, dtype, **(model_overrides or {}))
        tokens, mask = left_padded_batch(model.config.vocab_size, batch, seqlen, pads, device)
        for train in [p == "train" for p in passes]:
            for masked in (True, False):
                times = {}
                for name, backend in backends.items():
                    torch._dynamo.reset()
                    times[name] = _attempt(f"padded {attention} {name}",
                                           lambda: padded_ms(model, backend, tokens, mask if masked else None, train))
                base, ours = times.values()
                table.rows.append([attention, "train" if train else "prefill", "left-padded" if masked else "no mask",
                                   "failed" if base is None else base, "failed" if ours is None else ours,
                                   _ratio(base, ours)])
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    torch._dynamo.reset()
    yield table


def train_suite(device="cuda", dtype=torch.bfloat16, seqlen=4096, model_overrides=None):
    """Yields one table: a training step (forward with labels and `use_cache=False`, as training scripts
    call it, then backward) at batch 1, default torch.compile against ours, eager and sdpa attention code."""
    backends = {"default torch.compile": "inductor", "fa4_inductor": "fa4_inductor"}
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
            times[name] = _attempt(f"train {attention} {name}", lambda: padded_ms(model, backend, tokens, None, True))
            peaks[name] = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
        base, ours = times.values()
        table.rows.append([attention, seqlen, "failed" if base is None else base, "failed" if ours is None else ours,
                           _ratio(base, ours), *peaks.values()])
        del model
    torch._dynamo.reset()
    yield table


# ------------------------------------------------------------------------------------------ output


def environment() -> dict:
    info = {"date": datetime.date.today().isoformat(), "torch": torch.__version__, "python": platform.python_version()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    for package in ("nvidia-cutlass-dsl", "flash-attn-4", "transformers", "triton"):
        try:
            from importlib.metadata import version

            info[package] = version(package)
        except Exception:
            pass
    return info


def plot(table: Table, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    impls = table.columns[4:-1]
    variants = sorted({(row[0], row[1]) for row in table.rows})
    fig, axes = plt.subplots(1, len(variants), figsize=(4.5 * len(variants), 4), squeeze=False)
    for ax, (d, causal) in zip(axes[0], variants):
        rows = [r for r in table.rows if (r[0], r[1]) == (d, causal)]
        for i, name in enumerate(impls):
            ax.plot([r[2] for r in rows], [r[4 + i] for r in rows], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_title(f"d{d}, {'causal' if causal else 'non-causal'}")
        ax.set_xlabel("sequence length")
        ax.set_ylabel("TFLOP/s")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(table.title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fa4_inductor bench", description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default=",".join(SUITES), help=f"comma-separated, from {SUITES}")
    parser.add_argument("--out", help="write the tables (markdown) here")
    parser.add_argument("--json", help="write the raw tables as JSON here")
    parser.add_argument("--plot", help="write the op suite's plot (PNG) here")
    args = parser.parse_args(argv)
    suites = [s for s in args.suite.split(",") if s]
    unknown = set(suites) - set(SUITES)
    if unknown:
        parser.error(f"unknown suites {sorted(unknown)}")
    if not torch.cuda.is_available():
        print("bench needs a CUDA GPU", file=sys.stderr)
        return 2
    import fa4_inductor  # noqa: F401  (registers the ops)

    env = environment()
    command = "python -m fa4_inductor bench " + " ".join(argv if argv is not None else sys.argv[1:])
    print(json.dumps(env))
    tables: list[Table] = []
    for suite in suites:
        started = time.perf_counter()
        produced = {"op": op_suite, "overhead": overhead_suite, "decode": decode_suite, "e2e": e2e_suite,
                    "generate": generate_suite, "padded": padded_suite, "train": train_suite}[suite]()
        for table in [produced] if isinstance(produced, Table) else produced:
            tables.append(table)
            print(table.markdown(), flush=True)
            if args.plot and suite == "op":
                plot(table, args.plot)
        print(f"[{suite} took {time.perf_counter() - started:.0f} s]", flush=True)
    header = (f"## {env['date']}: `{command}`\n\n" + ", ".join(f"{k} {v}" for k, v in env.items() if k != "date") + "\n\n")
    if args.out:
        with open(args.out, "w") as f:
            f.write(header + "\n".join(t.markdown() for t in tables))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "command": command, "tables": [asdict(t) for t in tables]}, f, indent=1)
    return 0
