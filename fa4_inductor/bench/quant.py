"""The `quant` suite: quantized linears on the GPU.

GEMM tables, one per weight format (`FORMATS`): out[M, N] = x[M, K] @ W[N, K]^T on Llama-1B and Llama-8B
projection shapes (`SHAPES`), M = 1..4096, CUDA-graph medians (`timing.gpu_ms(cuda_graph=True)`), us, each the
median of `TIMING_ROUNDS` timings taken in rounds that alternate the columns:
- `bf16 cuBLAS`: F.linear over the bf16 weight (what the model runs unquantized);
- `ours`: our op as lowering emits it (whichever route it picks), and where the op has several CUDA routes,
  each route forced (the data behind `kernels/int8_linear.QUACK_MAX_ROWS`);
- `default compile`: the same torchao-quantized `nn.Linear` under default `torch.compile` (a failure is
  reported, e.g. `_int_mm` below 17 rows), and `fa4_inductor`: that module under our backend with the
  quantized families on;
- `quack direct`: quack's kernel called as its own API does, without our op (int8: no scale at all).

A format is a `Format`: its name, what makes its quantized weight, and its columns. `nvfp4` rows appear when
`torch.ops.fa4.nvfp4_linear(x, w_fp4, w_block_scale, w_global_scale, bias=None)` exists.

End to end: the Llama-1B-shaped HF model (bench/models.py) with torchao's int8 / NVFP4 weight-only configs,
static-cache decode under `mode="reduce-overhead"` (bench/llama_e2e.decode_tokens_per_s), and a 2048-token prefill
with each model's logits error against the unquantized model: bf16, then each format's torchao weights, under
default compile and ours, and the same codes as plain buffers (`int8.from_torchao` / `nvfp4.from_torchao`) under
ours.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import fp8, int8, nvfp4
from . import llama_e2e, models, timing
from .tables import Table, attempt, or_failed, report_failure, speedup
from .timing import gpu_ms

SHAPES = {  # model -> the (N, K) of its projections: qkv-ish, kv, gate/up, down
    "llama-1b": ((2048, 2048), (512, 2048), (8192, 2048), (2048, 8192)),
    "llama-8b": ((4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)),
}
ROWS = (1, 4, 16, 64, 256, 1024, 4096)
TIMING_ROUNDS = 3


def ours_backend(**options):
    """Our backend with every quantized-linear family turned on (the defaults; `options` overrides them)."""
    import fa4_inductor

    return fa4_inductor.backend(**{"int8_linear": True, "int8_int8_linear": True, "nvfp4_linear": True, **options})


def _torchao_linear(config_factory, w_bf16: torch.Tensor, bias: torch.Tensor | None = None) -> nn.Module:
    """An nn.Linear holding w_bf16, quantized in place by torchao's `quantize_` with config_factory()."""
    from torchao.quantization import quantize_

    n, k = w_bf16.shape
    with torch.device(w_bf16.device):
        linear = nn.Linear(k, n, bias=bias is not None, dtype=w_bf16.dtype)
    with torch.no_grad():
        linear.weight.copy_(w_bf16)
        if bias is not None:
            linear.bias.copy_(bias)
    linear.requires_grad_(False)
    quantize_(linear, config_factory())
    return linear


def _compiled(module: nn.Module, backend) -> Callable:
    """fn(x): module compiled for x's shape (static shapes, as decode runs them) under `backend` (None: default
    torch.compile), compiled afresh (after a Dynamo reset) for each new shape, so that no recompile limit and
    no other column's compiled code is in play."""
    compiled = {}

    def run(x):
        if tuple(x.shape) not in compiled:
            compiled.clear()
            torch._dynamo.reset()
            kwargs = {} if backend is None else {"backend": backend}
            compiled[tuple(x.shape)] = torch.compile(module, dynamic=False, **kwargs)
        return compiled[tuple(x.shape)](x)
    return run


@dataclass
class Format:
    name: str
    available: Callable[[], str | None]
    """Why the format's rows cannot be measured here, or None."""
    columns: Callable[[torch.Tensor], dict[str, Callable[[torch.Tensor], object]]]
    """The bf16 weight [N, K] -> column name -> fn(x) (the quantized weight made once for all M)."""
    note: str


# ------------------------------------------------------------------------------------------------- int8


def _int8_weight_only_config():
    from torchao.quantization import Int8WeightOnlyConfig

    return Int8WeightOnlyConfig()


def _int8_columns(w_bf16: torch.Tensor) -> dict:
    from fa4_inductor.kernels import int8_linear as op

    module = _torchao_linear(_int8_weight_only_config, w_bf16)
    w_int8 = module.weight.qdata
    scale = module.weight.scale.reshape(-1).to(w_bf16.dtype)  # as lowering passes torchao's scale
    call = functools.partial(torch.ops.fa4.int8_linear, w_int8=w_int8, w_scale=scale, bias=None,
                             scale_after_matmul=True)

    def forced(route):
        def run(x):
            reason = route.unsupported_reason(x, w_int8, scale, scale_after_matmul=True)
            if reason is not None:
                raise RuntimeError(reason)
            return route.run(x, w_int8, scale, scale_after_matmul=True)
        return run

    columns = {"ours (op)": lambda x: call(x), "ours: quack route": forced(op.QUACK),
               "ours: dense route": forced(op.DENSE)}
    columns["default compile"] = _compiled(module, None)
    columns["fa4_inductor"] = _compiled(module, ours_backend())
    columns["quack direct (no scale)"] = _quack_int8_direct(w_int8)
    return columns


def _quack_int8_direct(w_int8):
    def run(x):
        from quack.gemm_w4 import gemm_w4a16

        from fa4_inductor.kernels import quack_w4a16

        return gemm_w4a16(x, quack_w4a16.prepare_int8(w_int8), wformat="int8")
    return run


def _torchao_reason(name: str) -> Callable[[], str | None]:
    def reason():
        try:
            import torchao.quantization  # noqa: F401
        except Exception as e:
            return f"torchao is not importable ({type(e).__name__}: {e}); {name} rows need it"
        return None
    return reason


INT8 = Format("int8", _torchao_reason("int8"), _int8_columns,
              "torchao Int8WeightOnlyConfig (int8 per channel, float32 scales; ours and lowering take them in bf16).")


# ------------------------------------------------------------------------------------------- int8 x int8


def _int8_dynamic_config():
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig

    return Int8DynamicActivationInt8WeightConfig()


def _int8_int8_columns(w_bf16: torch.Tensor) -> dict:
    module = _torchao_linear(_int8_dynamic_config, w_bf16)
    w = module.weight
    w_int8, w_scale = w.qdata, w.scale.reshape(-1)

    def op_alone(x):  # the activation quantized (eager ops, inside the timing) as torchao does, then the op
        scale = (x.abs().amax(dim=-1, keepdim=True).float() / 127.5).clamp(min=1.1920928955078125e-07)
        x_int8 = (x.float() / scale).round().clamp(-128, 127).to(torch.int8)
        return torch.ops.fa4.int8_int8_linear(x_int8, scale, w_int8, w_scale, None, out_dtype=x.dtype)

    columns = {}
    if hasattr(torch.ops.fa4, "int8_int8_linear"):
        columns["ours (op + eager activation quant)"] = op_alone
    columns["default compile"] = _compiled(module, None)
    columns["fa4_inductor"] = _compiled(module, ours_backend())
    return columns


INT8_INT8 = Format("int8_int8", _torchao_reason("int8_int8"), _int8_int8_columns,
                   "torchao Int8DynamicActivationInt8WeightConfig (per-token int8 activations, per-channel int8 "
                   "weights, `_int_mm`); default compile fails below 17 rows.")


# ------------------------------------------------------------------------------------------------- nvfp4


def _nvfp4_reason() -> str | None:
    if not hasattr(torch.ops.fa4, "nvfp4_linear"):
        return "torch.ops.fa4.nvfp4_linear is not registered"
    from fa4_inductor.kernels import quack_w4a16

    return quack_w4a16._quack()[1]


def _nvfp4_columns(w_bf16: torch.Tensor) -> dict:
    from quack.blockscaled.nvfp4_utils import quantize_nvfp4_reference
    from quack.gemm_w4 import gemm_w4a16

    from fa4_inductor.kernels import quack_w4a16

    w_fp4, block_scale = quantize_nvfp4_reference(w_bf16)
    global_scale = torch.ones((), dtype=torch.float32, device=w_bf16.device)
    columns = {"ours (op)": lambda x: torch.ops.fa4.nvfp4_linear(x, w_fp4, block_scale, global_scale)}

    def direct(x):
        blob, strip, alpha = quack_w4a16.prepare_nvfp4(w_fp4, block_scale, global_scale)
        return gemm_w4a16(x, blob, strip, tensor_scale=alpha, n_out=w_fp4.shape[0], wformat="nvfp4")

    try:
        from torchao.prototype.mx_formats import NVFP4WeightOnlyConfig

        module = _torchao_linear(NVFP4WeightOnlyConfig, w_bf16)
        columns["default compile"] = _compiled(module, None)
        columns["fa4_inductor"] = _compiled(module, ours_backend())
    except Exception as e:
        report_failure("torchao NVFP4WeightOnlyConfig", e)
    columns["quack direct"] = direct
    return columns


NVFP4 = Format("nvfp4", _nvfp4_reason, _nvfp4_columns,
               "e2m1 weights, e4m3 scale per 16, float32 global scale (quack's reference quantizer); torchao "
               "NVFP4WeightOnlyConfig for the compiled columns.")

FORMATS = {f.name: f for f in (INT8, INT8_INT8, NVFP4)}


# ------------------------------------------------------------------------------------------------- suites


def _time_us(what: str, fn, x, device) -> float | str:
    try:
        return gpu_ms(functools.partial(fn, x), cuda_graph=device == "cuda") * 1e3
    except Exception as e:  # a column that cannot run this shape (default compile's _int_mm below 17 rows)
        print(f"  {what} failed: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)
        return f"failed: {type(e).__name__}"


def _alternating_times_us(what: str, columns: dict, x, device, rounds: int = TIMING_ROUNDS) -> dict:
    """Median microseconds of each column over `rounds` rounds that time every column once, in alternating order
    (`timing.alternating`): the columns that run the same program (default compile and ours above 16 int8 x int8
    rows) measured 10.8 against 15.0 us when timed one after the other (session 17). A column that fails is not
    timed again (`timing.interleaved_median`)."""
    return timing.interleaved_median(lambda name: _time_us(f"{what} {name}", columns[name], x, device), list(columns),
                                     rounds)


def gemm_table(fmt: Format, device="cuda", dtype=torch.bfloat16, models=tuple(SHAPES), rows=ROWS) -> Table:
    """One format's GEMM table: every shape of `models`, every M of `rows`."""
    table = None
    for model in models:
        for n, k in SHAPES[model]:
            torch.manual_seed(0)
            w_bf16 = torch.randn(n, k, dtype=dtype, device=device) / k ** 0.5
            columns = {"bf16 cuBLAS": functools.partial(lambda x, w: F.linear(x, w), w=w_bf16)}
            made = attempt(f"{fmt.name} {n}x{k} weights", functools.partial(fmt.columns, w_bf16))
            columns.update(made or {})
            if table is None:
                table = Table(f"{fmt.name} linear, N x K by M: CUDA-graph median us (lower is better)",
                              ["model", "N x K", "M", *columns, "fa4_inductor vs bf16",
                               "fa4_inductor vs default compile"],
                              note=f"{dtype}. {fmt.note}")
            for m in rows:
                x = torch.randn(m, k, dtype=dtype, device=device)
                times = _alternating_times_us(f"{fmt.name} {n}x{k} M={m}", columns, x, device)
                cells = [times.get(name, "n/a") for name in table.columns[3:-2]]
                ours = times.get("fa4_inductor")  # the module compiled by our backend: what a user gets
                number = (lambda t: t if isinstance(t, float) else None)
                table.rows.append([model, f"{n} x {k}", m, *map(or_failed, cells),
                                   speedup(number(times["bf16 cuBLAS"]), number(ours)),
                                   speedup(number(times.get("default compile")), number(ours))])
                # A run cut by its timeout still leaves the rows it measured.
                print(f"  {fmt.name} row: {' | '.join(map(str, table.rows[-1]))}", file=sys.stderr, flush=True)
            del columns, made, w_bf16
            torch._dynamo.reset()
    return table


def _nvfp4_weight_only_config():
    from torchao.prototype.mx_formats import NVFP4WeightOnlyConfig

    return NVFP4WeightOnlyConfig()


def _fp8_dynamic_config():
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow

    return Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())


E2E_CONFIGS = {"int8": _int8_weight_only_config, "nvfp4": _nvfp4_weight_only_config, "fp8": _fp8_dynamic_config}
"""The end-to-end tables' torchao configs by weight format: int8 and NVFP4 weight-only, fp8 weights with per-token fp8
activations (`torch._scaled_mm`; the only fp8 config with a Hopper kernel of its own)."""


PLAIN = {"nvfp4": (nvfp4.from_torchao, "fa4_inductor, nvfp4.from_torchao"),
         "int8": (int8.from_torchao, "fa4_inductor, int8.from_torchao"),
         "fp8": (fp8.from_torchao, "fa4_inductor, fp8.from_torchao")}
"""weights -> the function that turns torchao's weights into plain buffers, and the backend column's name."""
PLAIN_NVFP4, PLAIN_INT8 = PLAIN["nvfp4"][1], PLAIN["int8"][1]


E2E_BACKENDS = {"default": "default torch.compile", "ours": "fa4_inductor"}


def e2e_runs(formats=tuple(E2E_CONFIGS)) -> list[str]:
    """Every "weights:backend" run of the end-to-end table for these formats, in table order."""
    runs = ["bf16:default", "bf16:ours"]
    for fmt in formats:
        runs += [f"{fmt}:default", f"{fmt}:ours"] + ([f"{fmt}:plain"] if fmt in PLAIN else [])
    return runs


def _selected(every: list[str], runs, what: str) -> list[str]:
    """The "weights:backend" entries of `every` that `runs` names (all of them for None), in `every`'s order."""
    unknown = [r for r in runs or () if r not in every]
    if unknown:
        raise ValueError(f"unknown {what} runs {unknown} (from {every})")
    return [r for r in every if runs is None or r in runs]


def _llama_for(run: str, device, dtype, model_overrides=None):
    """(weights, backend column name, backend, model) for a "weights:backend" run: the Llama-1B-shaped model, seed
    0 (the same bf16 weights for every run), quantized by torchao on every linear but lm_head (its weight is tied to
    the embedding), its weights made plain buffers for "plain"."""
    from torchao.quantization import quantize_

    weights, which = run.split(":")
    name = PLAIN[weights][1] if which == "plain" else E2E_BACKENDS[which]
    backend = "inductor" if which == "default" else ours_backend()
    torch.manual_seed(0)
    model = models.llama("sdpa", device, dtype, **(model_overrides or {}))
    if weights != "bf16":
        quantize_(model, E2E_CONFIGS[weights](),
                  filter_fn=lambda module, fqn: isinstance(module, nn.Linear) and "lm_head" not in fqn)
    if which == "plain":  # the same codes as plain buffers: no subclass to guard and unwrap around each call
        PLAIN[weights][0](model)
    torch._dynamo.reset()
    return weights, name, backend, model


def e2e_table(device="cuda", dtype=torch.bfloat16, prompt=512, steps=64, model_overrides=None,
              formats=tuple(E2E_CONFIGS), runs=None) -> Table:
    """Llama-1B-shaped decode, tokens/s and ms/token: bf16 under default compile and ours, each weight format of
    `formats` (torchao weight-only) under default compile and ours (`e2e_runs`), or only the "weights:backend"
    entries of `runs` (each compile takes minutes on the GPU: a table can be split across calls). Each result is
    also printed to stderr as it is measured."""
    mode = "reduce-overhead" if device == "cuda" else "default"
    title = "Llama-1B-shaped HF model, weight-only quantized decode with a static cache (higher tokens/s is better)"
    table = Table(title,
                  ["weights", "backend", "tokens/s", "ms/token", "vs bf16 default compile",
                   "logits differ from the same weights under default compile by"],
                  note=f"{dtype} activations, batch 1, prompt {prompt}, greedy, the one-token step compiled with "
                       f"mode={mode!r}; {steps} steps, first 3 excluded. torchao Int8WeightOnlyConfig / "
                       "NVFP4WeightOnlyConfig / Float8DynamicActivationFloat8WeightConfig (per row) on every linear "
                       "but lm_head (tied to the embedding); our backend with its defaults.")
    results = {}
    for run in _selected(e2e_runs(formats), runs, "end-to-end"):
        weights, name, backend, model = _llama_for(run, device, dtype, model_overrides)
        results[(weights, name)] = attempt(f"e2e {weights} {name}", functools.partial(
            llama_e2e.decode_tokens_per_s, model, backend, prompt, steps, device, mode=mode))
        rate = (results[(weights, name)] or (None,))[0]
        print(f"  quant e2e {weights}, {name}: {f'{1e3 / rate:.3f} ms/token' if rate else 'failed'}",
              file=sys.stderr, flush=True)
        del model
    base = results.get(("bf16", "default torch.compile"))
    for (weights, name), result in results.items():
        rate, logits = result or (None, None)
        difference = "n/a"
        default = results.get((weights, "default torch.compile"))
        if logits is not None and default is not None and name != "default torch.compile":
            ref = default[1][:2]
            difference = f"{((logits[:2] - ref).abs().max() / ref.abs().max()).item():.1e}"
        ms = f"{1e3 / rate:.3f}" if rate else "n/a"
        vs_bf16 = speedup(base and base[0], rate, invert=True)
        table.rows.append([weights, name, or_failed(rate), ms, vs_bf16, difference])
    torch._dynamo.reset()
    return table


PREFILL_LOGITS = 64  # the last positions whose logits the prefill returns, and the error compares


def _logits_error(logits: torch.Tensor, ref: torch.Tensor) -> tuple[str, str]:
    """(relative RMS error, share of positions whose top-1 token agrees) of [S, vocab] logits against ref's."""
    logits, ref = logits.double(), ref.double()
    rms = ((logits - ref).norm() / ref.norm()).item()
    return f"{rms:.1e}", f"{(logits.argmax(-1) == ref.argmax(-1)).double().mean().item():.1%}"


def prefill_table(device="cuda", dtype=torch.bfloat16, seqlen=2048, model_overrides=None,
                  formats=tuple(E2E_CONFIGS), runs=None) -> Table:
    """Llama-1B-shaped prefill of `seqlen` tokens (batch 1, the last PREFILL_LOGITS positions' logits) for the runs
    of `e2e_runs` (or the named ones): the compiled forward's median wall time, and the error of those logits
    against the unquantized model run eagerly in float64 on the same tokens. The bf16 rows give bf16's own error;
    a quantized row's excess over them is what quantizing the weights costs, plus what its backend adds."""
    title = f"Llama-1B-shaped HF model, {seqlen}-token prefill with quantized weights (lower ms is better)"
    table = Table(title, ["weights", "backend", "prefill ms", "vs bf16 default compile",
                          "logits vs float64: relative RMS error", "top-1 agreement"],
                  note=f"{dtype} activations, batch 1, compiled with dynamic=False, the last {PREFILL_LOGITS} "
                       "positions' logits returned; median wall time of 7 calls. torchao weight-only configs on every "
                       "linear but lm_head, as in the decode table. The error compares those logits with the "
                       "unquantized model's, run eagerly in float64.")
    vocab = {**models.LLAMA_1B, **(model_overrides or {})}["vocab_size"]
    tokens = torch.randint(0, vocab, (1, seqlen), generator=torch.Generator().manual_seed(1)).to(device)
    selected = _selected(e2e_runs(formats), runs, "prefill")
    with torch.no_grad():
        _, _, _, exact = _llama_for("bf16:default", device, dtype, model_overrides)
        ref = exact.double()(tokens, logits_to_keep=PREFILL_LOGITS).logits[0]
        del exact
    base = None
    for run in selected:
        weights, name, backend, model = _llama_for(run, device, dtype, model_overrides)
        with torch.no_grad():
            compiled = models.compile_model(model, backend, dynamic=False)
            forward = functools.partial(compiled, tokens, logits_to_keep=PREFILL_LOGITS)
            error = attempt(f"prefill {weights} {name}", lambda: _logits_error(forward().logits[0], ref))
            ms = timing.median_wall_ms(forward, repeats=7) if error else None
        if run == "bf16:default":
            base = ms
        print(f"  quant prefill {weights}, {name}: {f'{ms:.2f} ms' if ms else 'failed'}, error {error}",
              file=sys.stderr, flush=True)
        table.rows.append([weights, name, or_failed(ms), speedup(base, ms), *(error or ("n/a", "n/a"))])
        del model, compiled, forward
        torch._dynamo.reset()
    return table


def quant_suite(device="cuda", dtype=torch.bfloat16, models=tuple(SHAPES), formats=("int8", "int8_int8", "nvfp4"),
                rows=ROWS, e2e=True, e2e_overrides=None, e2e_prompt=512, e2e_runs=None, prefill=True,
                prefill_seqlen=2048, prefill_runs=None):
    """Yields a GEMM table per available format (formats ("none",): none), then the end-to-end decode table (its
    `e2e_runs` only, when given), then the prefill table (`prefill_runs` only, when given)."""
    unknown = set(formats) - set(FORMATS) - {"none"}
    if unknown:
        raise ValueError(f"unknown quant formats {sorted(unknown)} (from {tuple(FORMATS)}, or none)")
    for name in (f for f in formats if f != "none"):
        fmt = FORMATS[name]
        reason = fmt.available()
        if reason is not None:
            print(f"  quant: no {name} rows: {reason}", file=sys.stderr)
            continue
        yield gemm_table(fmt, device, dtype, models, rows)
    e2e_formats = tuple(f for f in formats if f in E2E_CONFIGS) or tuple(E2E_CONFIGS)
    if e2e:
        yield e2e_table(device, dtype, prompt=e2e_prompt, model_overrides=e2e_overrides, formats=e2e_formats,
                        runs=e2e_runs)
    if prefill:
        yield prefill_table(device, dtype, seqlen=prefill_seqlen, model_overrides=e2e_overrides, formats=e2e_formats,
                            runs=prefill_runs)
