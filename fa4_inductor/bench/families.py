"""`families`: HF decoders other than Llama, at their own head dims, windows and attention code, default
torch.compile against ours: prefill, a left-padded prefill, a training step and static-cache decode. The sweep and
the e2e suites time Llama shapes only; these rows are where a family's own graph (a softcap, a window, partial rotary,
head dim 96 or 256, GPT-2's learned positions) could route a call to a slower path than default compile's.

Each model is its type's default config (the released model's shape) with fewer layers (`LAYERS`, GPT-2 keeps its
12) and a 32000-token vocabulary (the lm_head is the same GEMM on both backends), random weights, bf16.

Sliding-window models (Mistral, Gemma 2 / 3) decode without CUDA graphs (the row says so): transformers'
sliding-window StaticCache layers count tokens in a Python int (`cumulative_length_int`, read by the mask builder), so
Dynamo makes it a symbolic input and `reduce-overhead` records a new CUDA graph at every step, under either backend
(H100, session 56: 6-9 ms a step for 4 layers, against 0.6 ms for GPT-2's 12): such rows timed recording, not the
step."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .. import publishing
from . import models, padded, timing
from .llama_e2e import decode_tokens_per_s
from .models import BACKENDS, padded_batch
from .tables import Table, attempt, or_failed, speedup

LAYERS = 4
VOCAB = 32000
CASES = ("prefill", "padded", "train", "decode")
DECODE_STEPS = 32
PREFILL_ROUNDS = 11


@dataclass(frozen=True)
class Family:
    """One row group: a transformers model type, the attention code it runs, the overrides over its default config,
    and what in its graph the rows exercise."""

    model_type: str
    attention: str
    overrides: tuple = ()
    exercises: str = ""
    seq: int = 4096

    def config(self, scale: dict | None = None):
        """The default config of the type with `LAYERS` layers, `VOCAB` tokens, the family's overrides, then
        `scale` (the CPU tests' tiny sizes)."""
        import transformers

        from ..hf import special_tokens_within_vocabulary

        config = transformers.AutoConfig.for_model(self.model_type)
        settings = {"num_hidden_layers": LAYERS, "vocab_size": VOCAB, **dict(self.overrides), **(scale or {})}
        for key, value in settings.items():
            setattr(config, key, value)
        types = getattr(config, "layer_types", None)
        if isinstance(types, list) and len(types) > config.num_hidden_layers:
            config.layer_types = types[:config.num_hidden_layers]
        special_tokens_within_vocabulary(config)
        config._attn_implementation = self.attention
        return config

    def build(self, device, dtype, scale: dict | None = None):
        from transformers import AutoModelForCausalLM

        config = self.config(scale)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, attn_implementation=self.attention)
        return model.to(dtype).eval()


GEMMA3_LAYERS = ("sliding_attention",) * 3 + ("full_attention",)
FAMILIES = {
    "qwen3": Family("qwen3", "sdpa", (("num_key_value_heads", 8),), "head dim 128, q / k norms, GQA 4:1"),
    "mistral": Family("mistral", "sdpa", (("sliding_window", 1024), ("max_position_embeddings", 8192)),
                      "a 1024-key window over 4096 tokens, GQA 4:1"),
    "gemma2": Family("gemma2", "eager", (("max_position_embeddings", 8192),),
                     "eager code, head dim 256, softcap 50, 4096-key window every other layer"),
    "gemma3": Family("gemma3_text", "sdpa", (("layer_types", list(GEMMA3_LAYERS)), ("sliding_window", 1024),
                                             ("max_position_embeddings", 8192)),
                     "head dim 256, three 1024-key window layers to a global one"),
    "phi3": Family("phi3", "sdpa", (("max_position_embeddings", 8192),), "head dim 96, fused qkv"),
    "pythia": Family("gpt_neox", "sdpa", (("hidden_size", 2048), ("intermediate_size", 8192),
                                          ("num_attention_heads", 16), ("max_position_embeddings", 8192)),
                     "Pythia-1.4B's shape: partial rotary (a quarter of head dim 128)"),
    "gpt2": Family("gpt2", "sdpa", (("num_hidden_layers", 12), ("attn_pdrop", 0.0), ("resid_pdrop", 0.0),
                                    ("embd_pdrop", 0.0)),
                   "GPT-2 small, 12 layers, learned positions, dropout off (at 0.1 its training stays as written)",
                   seq=1024),
    "olmo2": Family("olmo2", "sdpa", (("max_position_embeddings", 8192),), "q / k norms over the whole hidden size"),
}


def _pads(seq: int) -> list[int]:
    return [0, seq // 16, seq // 4, 3 * seq // 4]


def families_suite(device="cuda", dtype=torch.bfloat16, families=tuple(FAMILIES), cases=CASES, scale=None,
                   seq=None, decode_steps=DECODE_STEPS, rounds=PREFILL_ROUNDS):
    """Yields one table: per family and case, default torch.compile against ours (ms), what ours did with each
    attention layer (the fa4 op, an SDPA call it wrote, or kept as written), and the largest difference of ours'
    output from default's (relative to default's largest value). Rows are printed as they are measured. `scale` and
    `seq` shrink every model (the CPU tests)."""
    table = Table("HF decoder families, default torch.compile against ours (ms, lower is better)",
                  ["family", "attention code", "head dim", "case", *BACKENDS, "speedup",
                   "ours: layers on the op / SDPA / kept", "ours vs default"],
                  note=f"{dtype}; each type's default config with {LAYERS} layers (GPT-2: 12) and a {VOCAB}-token "
                       "vocabulary, random weights. prefill: batch 1 x seq, last-token logits, no_grad; padded: batch "
                       "4 x seq / 2 left-padded by 0, seq / 32, seq / 8, 3 seq / 8 tokens (`attention_mask`); both "
                       f"backends compiled side by side, then the median of {rounds} alternating rounds (host-bound "
                       "rows drift between runs). train: batch 1 x seq, `labels=` loss (`use_cache=False`) and "
                       "backward, median of 5 after a compile; decode: static cache, a prompt of seq - "
                       f"{decode_steps} - 8 tokens, one-token steps under mode=\"reduce-overhead\" (ms a step; "
                       "models with a sliding-window cache without CUDA graphs). "
                       "Outputs compared: last-token logits, the loss, the first decode step's logits.")
    for name in families:
        family = FAMILIES[name]
        length = seq or family.seq
        torch.manual_seed(0)
        try:
            model = family.build(device, dtype, scale)
        except Exception as e:  # a type this transformers cannot build: the row says so
            table.rows.append([name, family.attention, "-", "build", "failed", "failed", "n/a",
                               f"{type(e).__name__}: {str(e)[:80]}", ""])
            continue
        config = model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        for case in cases:
            torch._dynamo.reset()
            if device == "cuda":
                torch.cuda.empty_cache()
            with publishing.collecting() as records:
                measured = attempt(f"{name} {case}", functools.partial(
                    _measure, model, case, length, decode_steps, device, rounds, records))
            times, outputs, ours_records = measured if measured is not None else ({}, {}, [])
            base, ours = (times.get(label) for label in BACKENDS)
            layers = [r for r in ours_records if r.family in ("sdpa", "handwritten")]
            on_op = sum(r.rewritten and r.detail.startswith("fa4.") for r in layers)
            as_sdpa = sum(r.rewritten for r in layers) - on_op
            label = f"{case} (no CUDA graphs)" if case == "decode" and _sliding_cache(config) else case
            row = [name, family.attention, head_dim, label, or_failed(base), or_failed(ours), speedup(base, ours),
                   f"{on_op} / {as_sdpa} / {len(layers) - on_op - as_sdpa}", _difference(*outputs.values())]
            table.rows.append(row)
            print("  " + " | ".join(str(x) if not isinstance(x, float) else f"{x:.3f}" for x in row), flush=True)
            for reason in sorted({r.detail for r in layers if not r.detail.startswith("fa4.")})[:3]:
                print(f"    not on the op: {reason[:200]}", flush=True)
        del model
    torch._dynamo.reset()
    yield table


def _measure(model, case: str, seq: int, decode_steps: int, device, rounds: int, records: list
             ) -> tuple[dict, dict, list]:
    """({backend: ms}, {backend: output}, ours' records) of one case; `records` is the list `publishing.collecting`
    fills while it runs."""
    times, outputs, ours = {}, {}, []
    vocab = model.config.vocab_size
    if case in ("prefill", "padded"):
        tokens, mask = (padded_batch(vocab, 4, seq // 2, _pads(seq // 2), device, "left") if case == "padded"
                        else (padded_batch(vocab, 1, seq, [0], device)[0], None))
        model.eval()
        calls = {}
        for label, backend in BACKENDS.items():
            compiled, first = models.compile_model(model, backend), len(records)
            calls[label] = functools.partial(_last_logits, compiled, tokens, mask, outputs, label)
            with torch.no_grad():
                calls[label]()  # compiles; both backends' entries side by side (Dynamo guards on the backend)
            if backend == "fa4_inductor":
                ours = records[first:]
        with torch.no_grad():
            return timing.interleaved_median_ms(calls, rounds), outputs, ours
    for label, backend in BACKENDS.items():
        torch._dynamo.reset()
        first = len(records)
        if case == "decode":
            model.eval()
            mode = None if _sliding_cache(model.config) else "reduce-overhead"
            tokens_per_s, logits = decode_tokens_per_s(model, backend, seq - decode_steps - 8, decode_steps, device,
                                                       mode=mode)
            times[label], outputs[label] = 1e3 / tokens_per_s, logits[-1]
        else:
            tokens = padded_batch(vocab, 1, seq, [0], device)[0]
            kept = []
            times[label] = padded.padded_ms(model, backend, tokens, None, True, keep=kept)
            outputs[label] = kept[-1]
        if backend == "fa4_inductor":
            ours = records[first:]
    return times, outputs, ours


def _sliding_cache(config) -> bool:
    """Whether a StaticCache of this model has sliding-window layers (their token count is a Python int)."""
    types = getattr(config, "layer_types", None) or ()
    return getattr(config, "sliding_window", None) is not None and (
        not types or any("sliding" in str(t) for t in types))


def _last_logits(compiled, tokens, mask, outputs: dict, label: str) -> None:
    outputs[label] = compiled(tokens, attention_mask=mask, logits_to_keep=1).logits


def _difference(default, ours) -> str:
    if default is None or ours is None:
        return "n/a"
    scale = default.float().abs().max().clamp_min(1e-6)
    return f"{((ours.float() - default.float()).abs().max() / scale).item():.1e}"
