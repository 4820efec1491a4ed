"""Where a compiled attention call's host time goes (H200; docs/benchmarks.md, session 6, runs 1 and 3).
Run from the repo root: `python3 docs/scripts/host_profile.py`. Prints timings and cProfile tables."""
import cProfile, io, pstats
import torch, torch.nn.functional as F
import fa4_inductor
from fa4_inductor.kernels import fa4, attention as att
from fa4_inductor.bench import attention_op as bench
from fa4_inductor.bench.timing import host_us_per_call

def prof(name, fn, n=2000):
    for _ in range(50): fn()
    pr = cProfile.Profile(); pr.enable()
    for _ in range(n): fn()
    torch.cuda.synchronize(); pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(28)
    print(f"\n===== cProfile {name} ({n} calls) =====\n" + s.getvalue()[:6000])

q, k, v = bench._hf_qkv(1, 128, 128, 8, 8, 64, torch.bfloat16, "cuda")
scale = 64 ** -0.5
def sdpa(q, k, v): return F.scaled_dot_product_attention(q, k, v, is_causal=True)
torch._dynamo.reset()
ours = torch.compile(sdpa, backend=fa4_inductor.fa4_inductor)
default = torch.compile(sdpa)
op = torch.ops.fa4.attention.default
with torch.no_grad():
    rows = {
        "fa4 adapter": lambda: fa4.forward(q, k, v, scale=scale, causal=True),
        "_attention_cuda": lambda: att._attention_cuda(q, k, v, None, None, scale=scale, causal=True),
        "op (no_grad)": lambda: op(q, k, v, None, None, scale=scale, causal=True),
        "compiled ours": lambda: ours(q, k, v),
        "compiled default": lambda: default(q, k, v),
        "eager sdpa": lambda: sdpa(q, k, v),
    }
    for name, fn in rows.items():
        print(f"{name:20s} {host_us_per_call(fn, calls=300):8.1f} us/call")
    with torch.inference_mode():
        qi, ki, vi = (t.clone() for t in (q, k, v))
        print(f"{'op (inference_mode)':20s} {host_us_per_call(lambda: op(qi, ki, vi, None, None, scale=scale, causal=True), calls=300):8.1f} us/call")
    prof("op", rows["op (no_grad)"])
    prof("compiled ours", rows["compiled ours"])
    prof("compiled default", rows["compiled default"])
# generated code
from torch._inductor.utils import run_and_get_code
torch._dynamo.reset()
with torch.no_grad():
    _, codes = run_and_get_code(torch.compile(sdpa, backend=fa4_inductor.fa4_inductor), q, k, v)
print("\n===== ours: generated code =====\n" + "\n".join(codes)[-3500:])
# the demo model's pieces
from fa4_inductor import demo
for attention in ("sdpa",):
    torch.manual_seed(0)
    model = demo.TinyLlama(demo.Config(attention=attention)).cuda().to(torch.bfloat16).eval()
    tokens = torch.randint(0, 512, (1, 2048), device="cuda")
    torch._dynamo.reset()
    with torch.no_grad():
        c_ours = torch.compile(model, backend=fa4_inductor.fa4_inductor); c_def = torch.compile(model)
        c_ours(tokens); c_def(tokens)
        print(f"demo {attention}: host us/call ours {host_us_per_call(lambda: c_ours(tokens), calls=50):.1f}  default {host_us_per_call(lambda: c_def(tokens), calls=50):.1f}")
        from triton.testing import do_bench
        print(f"demo {attention}: gpu ms ours {do_bench(lambda: c_ours(tokens)):.3f} default {do_bench(lambda: c_def(tokens)):.3f}")
        qd, kd, vd = bench._hf_qkv(1, 2048, 2048, 8, 2, 32, torch.bfloat16, "cuda")
        kd, vd = kd.repeat_interleave(4, 1), vd.repeat_interleave(4, 1)
        print(f"attention d32 2048: kernel {att.kernel_for(qd, kd[:, ::4], vd[:, ::4], causal=True, scale=0.17)}")
        print(f"  op gpu ms {do_bench(lambda: op(qd, kd, vd, None, None, scale=0.17, causal=True)):.4f}  sdpa {do_bench(lambda: sdpa(qd, kd, vd)):.4f}")
        prof("demo ours", lambda: c_ours(tokens), 300)
