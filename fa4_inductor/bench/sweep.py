"""`sweep`: our backend against default torch.compile over model sizes, sequence lengths, batches and
padding. The target it reports: ours >= 0.98x default on every row (speedup = default ms / ours ms).

Rows, by default:
- models: Llama-shaped `LlamaForCausalLM` (random weights, bf16, `attn_implementation="sdpa"`,
  `models.llama_shape`: head dim 64 below hidden 2048 and 128 at 2048, 4 query heads per KV head, MLP
  4x hidden) at hidden x layers 256x2, 2048x16, 512x4, 1024x2, 2048x4, 256x16, and a BERT-base
  `BertModel` (hidden 768, 12 layers, 12 heads), run in the order 256x2, 2048x16, BERT, then the rest
  (the extremes first, so a spent time budget cuts the middle);
- sequence lengths 128, 512, 2048, 8192 (BERT up to its 512 positions); batch 1 and 8, and at batch 8
  also padded: a quarter of the rows padded by different amounts (left for Llama, right for BERT),
  given as `attention_mask`; unpadded batches pass no mask;
- prefill: one no_grad forward (Llama: `use_cache=False`, last-token logits as `generate` asks for
  them), median wall-clock ms of `prefill_repeats` calls of each backend, the two called in alternating rounds
  (`timing.interleaved_median_ms`: the small rows are host-bound, and drift of the machine fell on whichever
  backend was timed during it);
- decode (Llama 256x2 and 2048x16): the prompt prefilled eagerly into a `StaticCache` sized
  prompt + steps (as `generate` sizes it), then one-token steps of a step function compiled with
  `mode="reduce-overhead"` (as the e2e suite does); ms per step over `decode_steps` steps after 3 warm
  ones, the median of `DECODE_RUNS` such runs of each backend, the two alternating. Padded decode passes the
  padding mask over the whole cache, one shape for every step (one CUDA graph), with positions counted in cache
  slots.
Each row also gives how far ours' output is from default's (relative to default's largest value:
last-token logits, BERT's hidden states at unpadded positions, the first decode step's logits).

Compiles, which are most of the run time: per (model, backend), prefill compiles the model once with
`dynamic=True` and reuses it over every sequence length; Dynamo adds a graph per batch class (batch 1 is
specialized) and per mask / no mask, 3 graphs, and ours one per side of its crossover guards that the sequence
lengths reach, both backends' entries side by side (up to 12: `RECOMPILE_LIMIT`).
Decode compiles one step function per (model, batch, padding, backend), `dynamic=True`, both backends' side by
side, fed a new cache per run. `torch._dynamo.reset()` comes before the prefill compiles of a model and before
each decode compile, so no cache entries pile up, and hitting the recompile limit raises (a failed row) instead
of silently timing eager code. The defaults come to 42 prefill and 12 decode
compiles (Llama layers 44 in all, BERT's 12): by an estimate, not a measurement, 5 to 12 s per compile
on the H200's host, 6 to 12 minutes. `time_budget_s` (450 s) stops starting measurements once it is
spent (those rows say "skipped: time budget"; run them in a second call with `llama_sizes=` /
`bert=False`), and rows whose estimated memory exceeds `memory_cap_gib` are skipped with their
estimate.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import dataclass

import torch

from . import models, timing
from .models import BACKENDS
from .tables import Table, report_failure

LLAMA_SIZES = ((256, 2), (2048, 16), (512, 4), (1024, 2), (2048, 4), (256, 16))
DECODE_SIZES = ((256, 2), (2048, 16))
SEQLENS = (128, 512, 2048, 8192)
BATCHES = (1, 8)
TARGET = 0.98
WARM_DECODE_STEPS = 3
DECODE_RUNS = 5


@dataclass(frozen=True)
class SweepModel:
    """One model of the sweep: `family` "llama" (causal LM, left padding, prefill and maybe decode) or
    "bert" (encoder, right padding, prefill only), built by `models.llama` / `models.bert`."""

    family: str
    config: tuple  # (key, value) pairs over the family's defaults
    decode: bool = False

    def build(self, device, dtype):
        builder = models.llama if self.family == "llama" else models.bert
        return builder("sdpa", device, dtype, **dict(self.config))

    @property
    def name(self) -> str:
        config = dict(self.config)
        if self.family == "bert":
            base = models.BERT_BASE
            return f"BERT h{config.get('hidden_size', base['hidden_size'])} x{config.get('num_hidden_layers', base['num_hidden_layers'])}"
        return f"Llama h{config['hidden_size']} x{config['num_hidden_layers']}"

    @property
    def padding_side(self) -> str:
        return "left" if self.family == "llama" else "right"


@dataclass(frozen=True)
class Case:
    """One row's measurement: `phase` "prefill" or "decode", `seq` the prompt length."""

    phase: str
    batch: int
    seq: int
    padded: bool

    @property
    def label(self) -> str:
        return f"{self.phase} b{self.batch} s{self.seq}{' padded' if self.padded else ''}"


def sweep_models(llama_sizes=LLAMA_SIZES, decode_sizes=DECODE_SIZES, bert=True, llama_overrides=None,
                 bert_overrides=None) -> list[SweepModel]:
    """The sweep's models: a Llama per (hidden, layers) in `llama_sizes` (decode rows too where the size
    is in `decode_sizes`) and BERT-base when `bert`; the overrides apply over every model of a family."""
    chosen = [SweepModel("llama", tuple({**models.llama_shape(hidden, layers), **(llama_overrides or {})}.items()),
                         decode=(hidden, layers) in decode_sizes)
              for hidden, layers in llama_sizes]
    if bert:  # after the first two Llamas (the extremes by default), before a spent time budget skips it
        chosen.insert(min(2, len(chosen)), SweepModel("bert", tuple((bert_overrides or {}).items())))
    return chosen


def padding_lengths(batch: int, seq: int) -> list[int]:
    """Pad tokens per row: the last quarter of the rows (at least one) padded by 1/(n+1), 2/(n+1), ... of
    the sequence, the first rows not at all."""
    padded_rows = max(1, batch // 4)
    return [0] * (batch - padded_rows) + [k * seq // (padded_rows + 1) for k in range(1, padded_rows + 1)]


def sweep_inputs(sweep_model: SweepModel, vocab: int, case: Case, device, mask_len: int | None = None):
    """(input_ids [batch, seq], attention_mask [batch, mask_len or seq] or None when unpadded). Left
    padding masks the first pads of a row, right padding its last ones; mask positions past `seq` (a
    decode cache's slots for new tokens) are 1."""
    generator = torch.Generator().manual_seed(case.batch * 100003 + case.seq)
    tokens = torch.randint(1, vocab, (case.batch, case.seq), generator=generator)
    if not case.padded:
        return tokens.to(device), None
    positions = torch.arange(mask_len or case.seq)[None, :]
    pads = torch.tensor(padding_lengths(case.batch, case.seq))[:, None]
    if sweep_model.padding_side == "left":
        mask = positions >= pads
    else:
        mask = (positions < case.seq - pads) | (positions >= case.seq)
    return tokens.to(device), mask.long().to(device)


def estimated_gib(model, case: Case, steps: int) -> float:
    """A generous estimate of the memory a row needs: the weights, one layer's activations over every
    token (no_grad), a padding mask expanded to [batch, seq, seq] bool and bf16, and the decode cache."""
    config = model.config
    element = next(model.parameters()).element_size()
    weights = sum(p.numel() for p in model.parameters()) * element
    tokens = case.batch * case.seq
    activations = tokens * (6 * config.hidden_size + 3 * config.intermediate_size) * element
    kv_len = case.seq + (steps + WARM_DECODE_STEPS if case.phase == "decode" else 0)
    mask = case.batch * case.seq * kv_len * (1 + element) if case.padded else 0
    cache = 0
    if case.phase == "decode":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        cache = 2 * config.num_hidden_layers * case.batch * config.num_key_value_heads * kv_len * head_dim * element
    return (weights + 1.5 * (activations + mask + cache)) / 2**30


def prefill_call(compiled, sweep_model: SweepModel, tokens, mask):
    """A no-argument forward of the compiled model; returns what the row compares (float, on the CPU:
    last-token logits, or BERT's hidden states with padded positions zeroed)."""
    def call():
        if sweep_model.family == "llama":
            return compiled(input_ids=tokens, attention_mask=mask, use_cache=False, logits_to_keep=1).logits[:, -1]
        return compiled(input_ids=tokens, attention_mask=mask).last_hidden_state

    def output():
        out = call().float()
        return (out if mask is None or sweep_model.family == "llama" else out * mask[..., None]).cpu()
    return call, output


def decode_step(model):
    """The one-token forward with a static cache that decode compiles."""
    from ..hf import cache_keyword

    keyword = cache_keyword(model)

    def step(token, position, cache, mask):
        return model(token, attention_mask=mask, position_ids=position, use_cache=True, **{keyword: cache}).logits[:, -1]
    return step


def decode_ms(compiled_step, model, sweep_model: SweepModel, case: Case, steps: int, device) -> tuple[float, torch.Tensor]:
    """(ms per decode step, the first step's logits): the prompt prefilled eagerly into a fresh
    StaticCache sized prompt + steps, then greedy one-token steps of `compiled_step`."""
    from transformers import StaticCache

    from ..hf import cache_keyword

    cache_len = case.seq + WARM_DECODE_STEPS + steps
    cache = StaticCache(config=model.config, max_cache_len=cache_len)
    tokens, mask = sweep_inputs(sweep_model, model.config.vocab_size, case, device, mask_len=cache_len)
    positions = torch.arange(case.seq, device=device)[None].expand(case.batch, -1)
    with torch.no_grad():
        logits = model(tokens, attention_mask=None if mask is None else mask[:, :case.seq], position_ids=positions,
                       use_cache=True, logits_to_keep=1, **{cache_keyword(model): cache}).logits[:, -1]
        state = {"token": logits.argmax(-1)}

        def step(i):
            position = torch.full((case.batch, 1), case.seq + i, device=device)
            logits = compiled_step(state["token"][:, None].clone(), position, cache, mask)
            if i == 0:
                state["first"] = logits.float().cpu()
            state["token"] = logits.argmax(-1)

        ms = timing.per_step_ms(step, WARM_DECODE_STEPS + steps, warm=WARM_DECODE_STEPS)
    return ms, state["first"]


RECOMPILE_LIMIT = 24
"""Dynamo's graphs a code object may hold in the sweep's compiles: 3 classes (batch 1, batch > 1, padded) times
ours' up to 3 sides of lowering/crossover.py's guards (a small attention, a host-bound graph), plus default's 3,
is 12; Dynamo's default of 8 failed the Llama-1B shape's padded rows (docs/benchmarks.md, session 21)."""


def _dynamo_limits():
    """Recompile-limit settings for the sweep's compiles: hitting the limit raises rather than running
    the frame eagerly (a timing of eager code would pass as a compiled one)."""
    config = torch._dynamo.config
    settings = {name: True for name in ("fail_on_recompile_limit_hit",) if hasattr(config, name)}
    return config.patch(recompile_limit=max(config.recompile_limit, RECOMPILE_LIMIT), **settings)


def sweep_suite(device="cuda", dtype=torch.bfloat16, llama_sizes=LLAMA_SIZES, decode_sizes=DECODE_SIZES, bert=True,
                seqlens=SEQLENS, batches=BATCHES, decode_steps=16, prefill_repeats=10, memory_cap_gib=100.0,
                time_budget_s=450.0, llama_overrides=None, bert_overrides=None, decode_mode=None,
                phases=("prefill", "decode")):
    """Yields one table, a row per (model, phase, batch, sequence length, padding); see the module
    docstring for the defaults and the compile plan. `decode_mode`: the decode step's compile mode (default:
    "reduce-overhead" on CUDA, as the e2e suite and HF's static-cache generate compile it; "default" measures a
    step without CUDA graphs, where every host microsecond shows). `phases`: the phases measured (one alone
    fits a large model's rows into one device call)."""
    started = time.perf_counter()
    mode = decode_mode or ("reduce-overhead" if device == "cuda" else "default")
    table = Table("Size sweep: HF Llama-shaped models and BERT-base, ours against default torch.compile "
                  "(ms, lower is better)",
                  ["model", "phase", "batch", "seq", "padding", "default ms", "ours ms", "speedup",
                   f"below {TARGET}x", "outputs differ by (relative)", "note"])
    for sweep_model in sweep_models(llama_sizes, decode_sizes, bert, llama_overrides, bert_overrides):
        torch.manual_seed(0)
        model = sweep_model.build(device, dtype)
        max_positions = model.config.max_position_embeddings
        cases, skipped = [], {}
        for phase in (p for p in phases if sweep_model.decode or p == "prefill"):
            for batch in batches:
                for padded in (False, True) if batch > 1 else (False,):
                    for seq in seqlens:
                        case = Case(phase, batch, seq, padded)
                        extra = decode_steps + WARM_DECODE_STEPS if phase == "decode" else 0
                        if seq + extra > max_positions:
                            continue
                        gib = estimated_gib(model, case, decode_steps)
                        if gib > memory_cap_gib:
                            skipped[case] = f"skipped: needs ~{gib:.0f} GiB > cap {memory_cap_gib:g}"
                        else:
                            cases.append(case)
        results = {name: {} for name in BACKENDS}
        deadline = started + time_budget_s
        _measure_prefill(results, model, sweep_model, [c for c in cases if c.phase == "prefill"], device,
                         prefill_repeats, deadline)
        _measure_decode(results, model, sweep_model, [c for c in cases if c.phase == "decode"], device, mode,
                        decode_steps, deadline)
        for case in sorted([*cases, *skipped], key=lambda c: (c.phase != "prefill", c.batch, c.padded, c.seq)):
            table.rows.append(_row(sweep_model, case, skipped.get(case), *(results[name].get(case) for name in BACKENDS)))
        del model
        torch._dynamo.reset()
        if device == "cuda":
            torch.cuda.empty_cache()
        print(f"  [sweep: {sweep_model.name} done at {time.perf_counter() - started:.0f} s]", file=sys.stderr, flush=True)
    measured = [row for row in table.rows if row[8] in ("yes", "no")]
    below = [row for row in measured if row[8] == "yes"]
    table.note = (f"{dtype}, random weights, sdpa attention code; speedup = default ms / ours ms; target: ours >= "
                  f"{TARGET}x default on every row: {len(measured) - len(below)} of {len(measured)} measured rows "
                  f"meet it ({len(table.rows) - len(measured)} not measured). Prefill: median of {prefill_repeats} "
                  f"forwards of each backend, called in alternating rounds; decode: ms per step over {decode_steps} "
                  f"steps, median of {DECODE_RUNS} runs of each backend, alternating, mode='{mode}'; padding: a "
                  f"quarter of the rows padded by different amounts. Took {time.perf_counter() - started:.0f} s.")
    yield table


def _measure_prefill(results: dict, model, sweep_model: SweepModel, cases: list[Case], device, rounds: int,
                     deadline: float) -> None:
    """Fills results[backend display name][case] with (ms, output) or a failure / skip text for the prefill cases:
    both backends compiled side by side (`dynamic=True`, one compile each reused over every case; Dynamo keeps an
    entry per backend), warmed, then timed in alternating rounds (`timing.interleaved_median_ms`): the rows are
    host-bound at small sizes, where timing one backend after the other gave the same compiled code 0.9 to 1.9 ms
    in three runs."""
    with _dynamo_limits(), torch.no_grad():
        torch._dynamo.reset()
        compiled = {name: models.compile_model(model, backend, dynamic=True) for name, backend in BACKENDS.items()}
        for case in cases:
            if time.perf_counter() > deadline:
                for name in BACKENDS:
                    results[name][case] = "skipped: time budget spent"
                continue
            tokens, mask = sweep_inputs(sweep_model, model.config.vocab_size, case, device)
            calls = {}
            for name in BACKENDS:
                try:  # the first call compiles; one broken backend must not cost the other its row
                    call, output = prefill_call(compiled[name], sweep_model, tokens, mask)
                    calls[name] = call, output()
                except Exception as e:
                    results[name][case] = report_failure(f"{sweep_model.name} {name} {case.label}", e)
            try:
                times = timing.interleaved_median_ms({name: call for name, (call, _) in calls.items()}, rounds)
                for name, (_, out) in calls.items():
                    results[name][case] = (times[name], out)
            except Exception as e:  # a failure while timing (out of memory, say) costs this row only
                failure = report_failure(f"{sweep_model.name} {case.label}, timing", e)
                for name in calls:
                    results[name][case] = failure
            _print_row(sweep_model, case, results)
            if device == "cuda":
                torch.cuda.empty_cache()


def _measure_decode(results: dict, model, sweep_model: SweepModel, cases: list[Case], device, mode: str,
                    decode_steps: int, deadline: float) -> None:
    """Fills results[backend display name][case] with (ms, output) or a failure / skip text for the decode cases:
    per (batch, padding) group, after a Dynamo reset, both backends' step functions compiled side by side; each
    case runs `DECODE_RUNS` times per backend (`decode_ms`, a fresh cache each), the backends alternating (ABBA...),
    and ms a step is each backend's median. On the H200 a run's steps fall into a fast or a slow mode (0.48 or
    0.75-0.9 ms a step for the same compiled tiny model, under either backend: docs/benchmarks.md, session 17), so
    runs of one backend after the other's would compare modes rather than code."""
    groups: dict[tuple, list[Case]] = {}
    for case in cases:
        groups.setdefault((case.batch, case.padded), []).append(case)
    with _dynamo_limits(), torch.no_grad():
        for group in groups.values():
            torch._dynamo.reset()
            steps = {name: models.compile_model(decode_step(model), backend, mode=mode, dynamic=True, fullgraph=True)
                     for name, backend in BACKENDS.items()}
            for case in group:
                if time.perf_counter() > deadline:
                    for name in BACKENDS:
                        results[name][case] = "skipped: time budget spent"
                    continue
                runs = {name: [] for name in BACKENDS}
                for name in timing.alternating(list(BACKENDS), DECODE_RUNS):
                    if isinstance(results[name].get(case), str):
                        continue  # this backend failed the case: the other still runs its rows
                    try:
                        runs[name].append(decode_ms(steps[name], model, sweep_model, case, decode_steps, device))
                    except Exception as e:  # one broken row must not cost the others
                        results[name][case] = report_failure(f"{sweep_model.name} {name} {case.label}", e)
                for name, measured in runs.items():
                    if measured and not isinstance(results[name].get(case), str):
                        results[name][case] = (statistics.median(ms for ms, _ in measured), measured[0][1])
                _print_row(sweep_model, case, results)
                if device == "cuda":
                    torch.cuda.empty_cache()


def _print_row(sweep_model: SweepModel, case: Case, results: dict) -> None:
    """A measured case's row to stderr at once: a run cut short (a device call's time limit) keeps what it timed.
    Never fails the measurement: a row it cannot make is printed as the raw results."""
    try:
        cells = _row(sweep_model, case, None, *(results[name].get(case) for name in BACKENDS))
    except Exception as e:
        cells = [sweep_model.name, case.label, f"{type(e).__name__}: {e}",
                 *(str(results[name].get(case))[:80] for name in BACKENDS)]
    print("  [row] | " + " | ".join(map(str, cells)) + " |", file=sys.stderr, flush=True)


def _row(sweep_model: SweepModel, case: Case, skipped: str | None, base, ours) -> list:
    """A table row from each backend's (ms, output), failure text or None (not run)."""
    pads = padding_lengths(case.batch, case.seq)
    padding = f"{sweep_model.padding_side}, {sum(p > 0 for p in pads)}/{case.batch} rows" if case.padded else "none"
    head = [sweep_model.name, case.phase, case.batch, case.seq, padding]
    base, ours = (result if result is not None else "failed: not run" for result in (base, ours))
    if skipped:
        return [*head, "skipped", "skipped", "n/a", "n/a", "n/a", skipped]
    notes = [f"{who}: {result}" for who, result in (("default", base), ("ours", ours)) if isinstance(result, str)]
    cells = [result[0] if isinstance(result, tuple) else "skipped" if result.startswith("skipped") else "failed"
             for result in (base, ours)]
    if notes:
        return [*head, *cells, "n/a", "n/a", "n/a", "; ".join(notes)[:300]]
    (base_ms, base_out), (ours_ms, ours_out) = base, ours
    ratio = base_ms / ours_ms
    difference = ((ours_out - base_out).abs().max() / base_out.abs().max().clamp_min(1e-30)).item()
    flag = "yes" if ratio < TARGET else "no"
    return [*head, base_ms, ours_ms, f"{ratio:.2f}x", flag, f"{difference:.1e}",
            "" if math.isfinite(difference) else "output not finite"]
