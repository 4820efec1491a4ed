"""The Llama-1B-shaped HF model end to end: `e2e` (prefill latency, static-cache decode tokens/s under
`mode="reduce-overhead"`) and `generate` (HF's `generate(cache_implementation="static")` compiling the
decode step itself), default torch.compile against our backend."""

from __future__ import annotations

import functools

import torch

from . import models, timing
from .models import BACKENDS, llama
from .tables import Table, attempt, or_failed, speedup


def prefill_ms(model, backend_name, seqlens, device) -> dict[int, float]:
    """Forward latency of the compiled model per prompt length (batch 1, last-token logits as
    `generate` asks for them in prefill)."""
    compiled = models.compile_model(model, backend_name, dynamic=True)
    out = {}
    with torch.no_grad():
        for s in seqlens:
            tokens = torch.randint(0, model.config.vocab_size, (1, s), device=device)
            out[s] = timing.median_wall_ms(lambda: compiled(tokens, logits_to_keep=1), repeats=7)
    return out


def decode_tokens_per_s(model, backend_name, prompt: int, steps: int, device, mode="reduce-overhead") -> tuple[float, torch.Tensor]:
    """Greedy decode with a static cache: the one-token forward compiled with `mode`; tokens/s and the
    logits of the prefill and the first decode step, [2, batch, vocab] float32 (a random model's logits are near ties,
    so tokens alone compare badly; later steps are not kept, so that the timed steps copy nothing the loop does not
    need)."""
    from transformers import StaticCache

    from ..hf import cache_keyword

    cache = {cache_keyword(model): StaticCache(config=model.config, max_cache_len=prompt + steps + 8)}
    tokens = torch.randint(0, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(0)).to(device)

    def step(token, position):
        return model(token, position_ids=position, **cache, use_cache=True).logits[:, -1]

    compiled = models.compile_model(step, backend_name, mode=mode, fullgraph=True) if mode != "eager" else step
    with torch.no_grad():
        logits = model(tokens, position_ids=torch.arange(prompt, device=device)[None], **cache,
                       use_cache=True).logits[:, -1]
        state = {"token": logits.argmax(-1), "position": torch.tensor([[prompt]], device=device)}
        seen = [logits.float()]

        def step(i):
            logits = compiled(state["token"][:, None].clone(), state["position"].clone())
            state["token"] = logits.argmax(-1)
            if i == 0:  # an untimed warm-up step (`timing.per_step_ms`)
                seen.append(logits.float())
            state["position"] += 1

        ms = timing.per_step_ms(step, steps)
    return 1e3 / ms, torch.stack(seen)


def e2e_suite(device="cuda", dtype=torch.bfloat16, seqlens=(2048, 8192), prompt=2048, steps=64,
              model_overrides=None):
    """Yields the prefill table, then the decode table (each as soon as it is measured)."""
    backends = BACKENDS
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
            times[name] = attempt(f"prefill {attention} {name}", functools.partial(prefill_ms, model, backend, seqlens, device))
        for s in seqlens:
            base, ours = (None if times[name] is None else times[name][s] for name in backends)
            prefill.rows.append([attention, s, or_failed(base), or_failed(ours), speedup(base, ours)])
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
            results[name] = attempt(f"decode {attention} {name}", functools.partial(
                decode_tokens_per_s, model, backend, prompt, steps, device, mode=mode))
        (base_rate, base_logits), (rate, logits) = (results[name] or (None, None) for name in backends)
        difference = "n/a"
        if base_logits is not None and logits is not None:  # the first steps, before greedy choices can diverge
            difference = f"{((logits[:2] - base_logits[:2]).abs().max() / base_logits[:2].abs().max()).item():.1e}"
        decode.rows.append([attention, prompt, or_failed(base_rate), or_failed(rate), speedup(base_rate, rate, invert=True),
                            difference])
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
            first = timing.median_wall_ms(lambda: model.generate(tokens, max_new_tokens=1, **kwargs), repeats=3)
            whole = timing.median_wall_ms(lambda: model.generate(tokens, max_new_tokens=new_tokens, **kwargs), repeats=3)
            scores = torch.stack(model.generate(tokens, max_new_tokens=new_tokens, **kwargs).scores).float()
    finally:
        model.generation_config.compile_config = None
    return first, batch * (new_tokens - 1) / max(whole - first, 1e-6) * 1e3, scores


def generate_suite(device="cuda", dtype=torch.bfloat16, prompt=1024, new_tokens=64, batch=4, model_overrides=None):
    backends = BACKENDS
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
            results[name] = attempt(f"generate {attention} {name}", functools.partial(
                generate_times, model, backend, prompt, new_tokens, batch, device))
        (base_first, base_rate, base_scores), (first, rate, scores) = (
            results[name] or (None, None, None) for name in backends)
        difference = "n/a"
        if base_scores is not None and scores is not None:  # the first step, before greedy choices can diverge
            difference = f"{((scores[0] - base_scores[0]).abs().max() / base_scores[0].abs().max()).item():.1e}"
        table.rows.append([attention, prompt, *map(or_failed, (base_first, first, base_rate, rate)),
                           speedup(base_rate, rate, invert=True), difference])
        del model
    yield table
    torch._dynamo.reset()
