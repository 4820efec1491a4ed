"""Weight-only decode GEMM benchmark (issue 15) on a GPU: ours (kernels/w4a16_decode.py) vs bf16 cuBLAS vs quack's
W4A16 GEMM (kernels/quack_w4a16.py), NVFP4 and int8 weights, x bf16.

    python tests/bench_w4a16.py                   # M = 1, 4, 16 on the issue's shapes
    python tests/bench_w4a16.py --m 1 --shapes 8192x8192 --splits 1,2,4,8   # split-count sweep, ours only
    python tests/bench_w4a16.py --m 1,8 --cta auto,2x2x4,1x1x8              # CTA-shape sweep, ours only
    python tests/bench_w4a16.py --m 1,8,16 --load registers,bulk,bulk+prefetch,bulk+scales   # load paths
    python tests/bench_w4a16.py --m 1 --load bulk --stages 2,3,4,5              # bulk ring depth sweep
    python tests/bench_w4a16.py --m 1,8 --pack off,on --shapes 8192x8192,2048x8192   # NVFP4 plain vs packed layout
    python tests/bench_w4a16.py --m 1,4 --gemv off,on --shapes 8192x8192,512x2048    # tensor-core kernel vs GEMV
    python tests/bench_w4a16.py --m 1 --gemv int --prefetch 0,4,8 --shapes 8192x8192   # the integer GEMV's L2 prefetch
    python tests/bench_w4a16.py --m 1,2 --gemv on,int --shapes 8192x8192   # fp32 GEMV vs the integer GEMVs (both formats)

`--load` (comma list of `w4a16_decode.parse_load` specs; default FA4_INDUCTOR_W4A16_LOAD, else registers)
times ours once per load path; `--stages` gives each bulk path those ring depths ("bulk:3"; a depth that does
not fit shared memory is reported and skipped). They combine with `--splits` and `--cta`. `--pack off,on,tiles` times
the NVFP4 rows once per layout (the packed one prepared before timing, `w4a16_decode.pack_nvfp4`; default
FA4_INDUCTOR_W4A16_PACK); int8 rows are timed once. `--gemv off,on` times ours once per route for M <= 4 (off: the
tensor-core kernel, on: the CUDA-core GEMV, `cute/w4a16_gemv.py`; default FA4_INDUCTOR_W4A16_GEMV), NVFP4 (plain layout)
and int8; "RxK" (4x1, 2x2, 8x1) forces the GEMV's rows a warp and K warps (tuning); the accuracy column follows the
same order.

Timing: each kernel is called on C copies of its weight (C copies > 2x the 50 MB L2, so every call reads its
weight from HBM as a decode step does) inside one CUDA graph; the median over 20 replays divided by C is the
time per call (launch gaps inside the graph included). TB/s counts the weight bytes (codes + scales).
Targets (H200): 8192x8192 M=1 NVFP4 <= 11 us, int8 <= 18 us; M=16 within 15% of M=1; 2048x8192 and
8192x2048 M=1 NVFP4 >= 2.5x bf16.
"""

import argparse
import math
import os

import torch
import torch.nn.functional as F

from fa4_inductor.kernels import quack_w4a16, switches, w4a16_decode as w4

SHAPES = [(8192, 8192), (2048, 8192), (8192, 2048), (14336, 4096), (4096, 14336), (128256, 4096)]
L2_BYTES = 50 * 2 ** 20


def graph_us(calls) -> float:
    """Median microseconds per call of `calls` (a list of thunks, one per weight copy) replayed in one graph."""
    for c in calls:  # compile, prepare weights, warm up
        c()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        for c in calls:
            c()
        with torch.cuda.graph(graph, stream=side):
            for c in calls:
                c()
    torch.cuda.current_stream().wait_stream(side)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return sorted(times)[len(times) // 2]


def copies(nbytes: int) -> int:
    return max(2, min(32, math.ceil(2 * L2_BYTES / nbytes)))


def weights(n, k, c, seed=0, int8_scales=torch.float32):
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for _ in range(c):
        w_fp4 = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=g)
        block = (torch.rand(n, k // 16, device="cuda", generator=g) * 6 + 0.01).to(torch.float8_e4m3fn)
        gs = torch.full((), 1e-2, device="cuda")
        w8 = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda", generator=g)
        s8 = (torch.rand(n, device="cuda", generator=g) / 100).to(int8_scales)
        out.append((w_fp4, block, gs, w8, s8))
    return out


def _cta_label(cta):
    return "auto" if cta is None else "x".join(map(str, cta))


def bench_shape(n, k, ms, splits_list=None, loads=(None,), ctas=None, int8_scales=torch.float32, packs=(None,),
                gemvs=(None,), x_dtype=torch.bfloat16):
    fp4_bytes, int8_bytes, bf16_bytes = n * k * 9 // 16, n * k + int8_scales.itemsize * n, 2 * n * k
    c = copies(fp4_bytes)
    ws = weights(n, k, c, int8_scales=int8_scales)
    wbf = [torch.randn(n, k, dtype=x_dtype, device="cuda") for _ in range(copies(bf16_bytes))]
    for m in ms:
        x = torch.randn(m, k, dtype=x_dtype, device="cuda")
        row = {}
        tag = lambda ld: f" {ld}" if ld else ""  # noqa: E731
        ptag = lambda pk: "" if pk is None else {False: " plain", True: " packed", "tiles": " tiles"}[pk]  # noqa: E731
        gtag = gemv_tag
        gemvs_m = gemvs if m <= w4.GEMV_MAX_M else (None,)
        loads_m = [ld for ld in loads if fits(ld, m)]
        sweep = bool(splits_list or ctas)
        if sweep:  # ours only, beside bf16
            row["bf16"] = (graph_us([lambda w=w: F.linear(x, w) for w in wbf]), bf16_bytes)
            for cta in ctas or [None]:
                for s in splits_list or [None]:
                    for ld in loads_m:
                        if ld not in (None, w4.AUTO_LOAD) and w4.is_xsmem(ld) != (cta is not None and cta[2] == 1):
                            continue  # the xsmem path takes CTAs of one K warp, and only it
                        if ld not in (None, w4.AUTO_LOAD) and w4.is_xsmem(ld) and s and not all(
                                xsmem_fits(f, m, n, k, s, cta) for f in ("nvfp4", "int8")):
                            continue
                        name = f"{_cta_label(cta)} s{s or 'auto'}{tag(ld)}"
                        for pk in packs:
                            row[f"ours nvfp4 {name}{ptag(pk)}"] = (graph_us([
                                lambda w=w: w4.nvfp4_matmul(x, *w[:3], splits=s, cta=cta, load=ld, pack=pk, gemv=False)
                                for w in ws]), fp4_bytes)
                        row[f"ours int8 {name}"] = (graph_us([
                            lambda w=w: w4.int8_matmul(x, w[3], w[4], splits=s, cta=cta, load=ld, gemv=False)
                            for w in ws]), int8_bytes)
        else:
            ours = m <= w4.MAX_M  # above, the ops route elsewhere (quack, dequantize): bf16 and quack only
            row["bf16"] = (graph_us([lambda w=w: F.linear(x, w) for w in wbf]), bf16_bytes)
            for ld in loads_m if ours else ():
                for gv in gemvs_m:
                    for pk in packs:
                        if gv and pk:
                            continue  # the GEMV reads the plain layout only
                        row[f"ours nvfp4{tag(ld)}{ptag(pk)}{gtag(gv)}"] = (graph_us([
                            lambda w=w: w4.nvfp4_matmul(x, *w[:3], load=ld, pack=pk, gemv=gv) for w in ws]), fp4_bytes)
                    row[f"ours int8{tag(ld)}{gtag(gv)}"] = (
                        graph_us([lambda w=w: w4.int8_matmul(x, w[3], w[4], load=ld, gemv=gv) for w in ws]), int8_bytes)
            if quack_w4a16.unsupported_reason(x, "nvfp4", n, k) is None:
                row["quack nvfp4"] = (graph_us([lambda w=w: quack_w4a16.nvfp4_matmul(x, *w[:3]) for w in ws]),
                                      fp4_bytes)
            if quack_w4a16.unsupported_reason(x, "int8", n, k) is None:
                row["quack int8"] = (graph_us([lambda w=w: quack_w4a16.int8_matmul(x, w[3], w[4]) for w in ws]),
                                     int8_bytes)
            if ours:  # accuracy of ours against the dequantized weight in float64 (relative to the output's scale)
                w_fp4, block, gs, w8, s8 = ws[0]
                from test_nvfp4_linear import float64_dequantized

                ref4 = x.double() @ float64_dequantized(w_fp4, block, gs).T
                ref8 = x.double() @ (w8.double() * s8.double()[:, None]).T
                errs = []
                for ld in loads_m:
                    for gv in gemvs_m:
                        e4 = [(w4.nvfp4_matmul(x, w_fp4, block, gs, load=ld, pack=pk, gemv=gv).double() - ref4).abs()
                              .max() / ref4.abs().max() for pk in packs if not (gv and pk)]
                        e8 = ((w4.int8_matmul(x, w8, s8, load=ld, gemv=gv).double() - ref8).abs().max()
                              / ref8.abs().max())
                        errs.append(f"{tag(ld).strip() or 'ours'}{gtag(gv)} nvfp4 "
                                    f"{'/'.join(f'{e.item():.1e}' for e in e4)} int8 {e8.item():.1e}")
        shapes, splits = {}, {f: "-" for f in w4.FORMATS}
        for f in w4.FORMATS if m <= w4.MAX_M else ():  # what the default load path runs
            shapes[f], _, splits[f], _ = w4.call_plan(m, n, w4.padded_k(f, k), f, w4._num_sms(0))
        base = row.get("bf16", (None,))[0]
        cells = []
        for name, (us, nbytes) in row.items():
            speed = f" {base / us:4.2f}x" if base and name != "bf16" else ""
            cells.append(f"{name} {us:6.1f} us {nbytes / us / 1e6:4.2f} TB/s{speed}")
        acc = "" if sweep or m > w4.MAX_M else "  rel err " + ", ".join(errs)
        auto = f"cta {_cta_label(shapes['nvfp4'])}/{_cta_label(shapes['int8'])} " if shapes else ""
        if any(gemvs_m):
            auto += "gemv " + "/".join("x".join(map(str, w4.gemv_shape(n, w4.padded_k(f, k) // w4.CHUNK_VALUES[f] * 2,
                                                                       w4._num_sms(0)))) for f in w4.FORMATS) + " "
        print(f"{n}x{k} m{m:<2} {auto}splits {splits['nvfp4']}/{splits['int8']}  " + "  |  ".join(cells) + acc,
              flush=True)
    del ws, wbf
    torch.cuda.empty_cache()


def load_specs(specs, stages):
    """The load paths to time: each spec, each bulk one at each of `stages` (checked per M: `fits`)."""
    out = []
    for spec in specs:
        path, _ = (spec, None) if spec == w4.AUTO_LOAD else w4.parse_load(spec)
        out += [spec] if not path.startswith("bulk") or not stages else [f"{path}:{s}" for s in stages]
    return out


def xsmem_fits(fmt, m, n, k, splits, cta):
    try:
        w4.xsmem_plan(m, n, w4.padded_k(fmt, k), fmt, w4.CtaShape(*cta), w4._num_sms(0), splits)
        return True
    except ValueError as e:
        print(f"{n}x{k} m{m} {fmt}: skipped {_cta_label(cta)} s{splits}: {e}")
        return False


def fits(spec, m):
    """Whether load path `spec` has a variant at m rows (a ring that deep fits shared memory), else say why."""
    if spec in (None, w4.AUTO_LOAD) or m > w4.MAX_M:
        return True
    try:
        w4.load_key(spec, w4.m_bucket(m), "nvfp4", w4.WIDE)  # the largest stages: fits the others too
        return True
    except ValueError as e:
        print(f"m{m}: skipped {spec}: {e}")
        return False


def gemv_tag(gv) -> str:
    """A row name's part for the matmuls' `gemv` argument (`parse_gemv`'s values)."""
    if gv is None:
        return ""
    if isinstance(gv, tuple):
        if gv[0] == w4.INT_GEMV:
            return " int gemv " + "x".join(map(str, gv[1:]))
        return f" gemv {gv[0]}x{gv[1]}"
    return " int gemv" if gv == w4.INT_GEMV else " gemv" if gv else " mma"


def parse_gemv(value):
    """--gemv's off / on / int / int:RxK[xS[xW]] / RxK -> the matmuls' `gemv` argument: False, True, INT_GEMV (calls of
    1..4 rows on the integer GEMVs: NVFP4's, int8's), (INT_GEMV, rows a warp, K warps[, K splits[, warps a CTA]];
    int8's: no split) or (rows a warp, K warps)."""
    value = value.strip()
    if value in ("off", "on", "int"):
        return {"off": False, "on": True, "int": w4.INT_GEMV}[value]
    if value.startswith("int:"):
        return (w4.INT_GEMV, *map(int, value[4:].split("x")))
    return tuple(map(int, value.split("x")))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--m", default="1,4,16")
    p.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    p.add_argument("--splits", default=None, help="comma list: sweep split counts (ours and bf16 only)")
    p.add_argument("--cta", default=None, help="comma list of CTA shapes RTxWNxWK or auto: sweep them (ours and "
                                                "bf16 only)")
    p.add_argument("--load", default=None, help="comma list of load paths: registers, bulk, bulk+prefetch:4 ...")
    p.add_argument("--stages", default=None, help="comma list: ring depths for each bulk load path")
    p.add_argument("--pack", default=None, help="comma list of NVFP4 layouts: off (plain), on (packed), tiles")
    p.add_argument("--gemv", default=None, help="comma list of M <= 4 routes: off (tensor-core kernel), on (GEMV), "
                                                 "int (the integer GEMVs, NVFP4 and int8), int:RxK (its shape), "
                                                 "int:RxKxS (and K split among S CTAs of a cluster), int:RxKxSxW "
                                                 "(and W warps a CTA), "
                                                 "RxK (the GEMV with R rows a warp, K warps along K)")
    p.add_argument("--prefetch", default=None, help="comma list of the integer GEMV's L2 prefetch windows "
                                                     "(FA4_INDUCTOR_INT_GEMV_PREFETCH: 0, or 3 and more steps): each "
                                                     "a pass over the shapes")
    p.add_argument("--int8-scales", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="the int8 weights' per-channel scale dtype")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"),
                   help="x's dtype (and the half-precision weights' of the cuBLAS row, labelled bf16)")
    a = p.parse_args()
    ms = [int(v) for v in a.m.split(",")]
    splits = [int(v) for v in a.splits.split(",")] if a.splits else None
    ctas = [None if c == "auto" else switches.parse_cta_shape(c) for c in a.cta.split(",")] if a.cta else None
    loads = load_specs(a.load.split(",") if a.load else [w4.configured_load()],
                       [int(v) for v in a.stages.split(",")] if a.stages else None)
    print(f"device {torch.cuda.get_device_name()}, SMs {w4._num_sms(0)}, load paths {', '.join(loads)} "
          f"(bulk default depths, wide CTAs: M <= 8 {w4.bulk_stages(8, w4.WIDE)}, M <= 16 "
          f"{w4.bulk_stages(16, w4.WIDE)}; narrow: {w4.bulk_stages(8, w4.NARROW)}, "
          f"{w4.bulk_stages(16, w4.NARROW)})")
    packs = [{"off": False, "on": True, "tiles": "tiles"}[v.strip()] for v in a.pack.split(",")] if a.pack else [None]
    gemvs = [parse_gemv(v) for v in a.gemv.split(",")] if a.gemv else [None]
    for prefetch in a.prefetch.split(",") if a.prefetch else [None]:
        if prefetch is not None:
            os.environ[switches.INT_GEMV_PREFETCH] = prefetch
            switches.reset()
            print(f"## {switches.INT_GEMV_PREFETCH}={prefetch}")
        for shape in a.shapes.split(","):
            n, k = map(int, shape.split("x"))
            bench_shape(n, k, ms, splits, loads, ctas, getattr(torch, a.int8_scales), packs, gemvs,
                        getattr(torch, a.dtype))


if __name__ == "__main__":
    main()
