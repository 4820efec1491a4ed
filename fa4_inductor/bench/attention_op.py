"""Suites over one attention call: `op` (prefill TFLOP/s), `backward` (a training step's forward + backward),
`overhead` (host cost per call), `crossover`
(fa4::attention against SDPA, host included and GPU only: the data behind `lowering/crossover.py`) and
`decode` (one query token against a KV cache), plus `decode_kernel_comparison` for `tests/bench_decode.py`."""

from __future__ import annotations

import functools
import sys
from typing import Callable

import torch
import torch.nn.functional as F

from .tables import Table
from .timing import gpu_ms, host_us_per_call


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
                        ms = gpu_ms(functools.partial(impl, q, k, v, causal, d ** -0.5))
                        results[name] = flops / ms / 1e9
                    except Exception as e:  # a backend that does not take the shape
                        print(f"  {name} d{d} s{s} causal={causal}: {type(e).__name__}: {e}", file=sys.stderr)
                        results[name] = float("nan")
                ratio = results["fa4::attention"] / results.get("FA4 direct", float("nan"))
                table.rows.append([d, causal, s, f"{b}x{h}", *results.values(), ratio])
                del q, k, v
    return table


def _kv_repeated(impl):
    def call(q, k, v, causal, scale):
        group = q.shape[1] // k.shape[1]
        return impl(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), causal, scale)
    return call


def backward_suite(device="cuda", dtype=torch.bfloat16, shapes=((32, 8, 64), (32, 8, 128)),
                   seqlens=(1024, 2048, 4096, 8192, 16384), tokens=16384) -> Table:
    """Causal GQA attention of a training step, forward + backward: ms per call of each implementation (the data
    behind routing training attention; issue 12's step spends 9.6 ms of 62 in FA4's forward and backward).
    `shapes`: (q heads, KV heads, head dim), Llama-1B's and Llama-8B's; batch = tokens // seqlen."""
    impls = attention_impls(device)
    if "SDPA cuDNN" in impls:  # HF's sdpa code repeats K / V per q head where SDPA's GQA path does not apply
        impls["SDPA cuDNN, K/V repeated"] = _kv_repeated(impls["SDPA cuDNN"])
    table = Table("Causal attention, forward + backward, ms (lower is better)",
                  ["heads q/kv x dim", "seqlen", "batch", *(f"{n} fwd" for n in impls), *(f"{n} fwd+bwd" for n in impls)],
                  note=f"{dtype}, {tokens} tokens, q/k/v as HF's [B, H, S, D] views of [B, S, H, D], gradient of "
                       "a fresh random output; GPU time, median, L2 flushed.")
    for hq, hkv, d in shapes:
        for s in seqlens:
            b = max(1, tokens // s)
            q, k, v = (t.requires_grad_() for t in _hf_qkv(b, s, s, hq, hkv, d, dtype, device))
            grad = torch.randn(b, hq, s, d, dtype=dtype, device=device)
            forward, both = {}, {}
            for name, impl in impls.items():
                def fwd(impl=impl):
                    with torch.no_grad():
                        return impl(q, k, v, True, d ** -0.5)

                def fwd_bwd(impl=impl):
                    out = impl(q, k, v, True, d ** -0.5)
                    out = out[0] if isinstance(out, tuple) else out
                    layout = grad if out.shape == grad.shape else grad.transpose(1, 2)  # FA4 direct: [B, S, H, D]
                    return torch.autograd.grad(out, (q, k, v), layout)
                try:
                    forward[name], both[name] = gpu_ms(fwd), gpu_ms(fwd_bwd)
                except Exception as e:  # a backend that does not take the shape
                    print(f"  {name} {hq}/{hkv}x{d} s{s}: {type(e).__name__}: {e}", file=sys.stderr)
                    forward[name] = both[name] = float("nan")
            table.rows.append([f"{hq}/{hkv}x{d}", s, b, *forward.values(), *both.values()])
    return table


def crossover_suite(device="cuda", dtype=torch.bfloat16, head_dims=(32, 64, 128), heads=((1, 8, 8), (1, 32, 8), (8, 32, 8)),
                    seqlens=(128, 512, 1024, 2048, 4096, 8192), max_elements=2**31) -> Table:
    """Causal attention through `fa4::attention` and through SDPA (PyTorch's pick, `enable_gqa`): microseconds
    per call back to back (host time included, what a host-bound model pays) and GPU time under a CUDA
    graph (what a GPU-bound one pays), with the GFLOP that `lowering/crossover.py` compares."""
    from fa4_inductor.kernels import crossover

    table = Table("fa4::attention against SDPA, causal, microseconds (lower is better)",
                  ["b", "hq/hkv", "seq", "head dim", "GFLOP", "op wall", "SDPA wall", "op gpu", "SDPA gpu",
                   "crossover.py would keep SDPA (host-bound graph)"],
                  note=f"{dtype}; wall: back-to-back calls, best of 5 x 200; gpu: CUDA-graph median.")
    for d in head_dims:
        for b, hq, hkv in heads:
            for s in seqlens:
                if b * hq * s * d * 6 > max_elements:
                    continue
                q, k, v = _hf_qkv(b, s, s, hq, hkv, d, dtype, device)
                ours = functools.partial(_ours, q, k, v, True, d ** -0.5)
                sdpa = functools.partial(F.scaled_dot_product_attention, q, k, v, is_causal=True, enable_gqa=hq != hkv)
                gflop = crossover.attention_gflop(b, hq, s, s, d, causal=True)
                limit = crossover.gflop_limit(d)
                with torch.no_grad():
                    times = [host_us_per_call(ours), host_us_per_call(sdpa),
                             gpu_ms(ours, cuda_graph=device == "cuda") * 1e3,
                             gpu_ms(sdpa, cuda_graph=device == "cuda") * 1e3]
                table.rows.append([b, f"{hq}/{hkv}", s, d, round(gflop, 3), *times, gflop < limit])
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
    calls["compiled SDPA, backend=fa4_inductor"] = functools.partial(torch.compile(sdpa, backend=fa4_inductor), q, k, v)
    calls["compiled SDPA, default torch.compile"] = functools.partial(torch.compile(sdpa), q, k, v)
    table = Table("Host overhead per attention call, microseconds (lower is better)", ["call", "us / call"],
                  note=f"b1 h8 s128 d64 causal {dtype}: the kernels are tiny, so back-to-back calls measure "
                       "the host path (best of 5 rounds of 200 calls).")
    for name, call in calls.items():
        with torch.no_grad():
            table.rows.append([name, host_us_per_call(call)])
    return table


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
                            ms = gpu_ms(functools.partial(impl, q, k, v, False, d ** -0.5), cuda_graph=device == "cuda")
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
