import time, sys, torch, torch.nn as nn, cProfile, pstats
import fa4_inductor
from torchao.quantization import quantize_, Int8WeightOnlyConfig
torch.manual_seed(0)
L = int(sys.argv[1]) if len(sys.argv) > 1 else 112
model = nn.Sequential(*[nn.Linear(64, 64, bias=False) for _ in range(L)]).to(torch.bfloat16).requires_grad_(False)
quantize_(model, Int8WeightOnlyConfig())
x = torch.randn(1, 64, dtype=torch.bfloat16)
for name, be in [("default", "inductor"), ("ours", fa4_inductor.backend(int8_linear=False))]:
    torch._dynamo.reset()
    f = torch.compile(model, backend=be)
    with torch.no_grad():
        for _ in range(3): f(x)
        t = time.perf_counter()
        for _ in range(200): f(x)
        print(name, f"{(time.perf_counter()-t)/200*1e3:.3f} ms/call")
        if len(sys.argv) > 2:
            cProfile.run("for _ in range(50): f(x)", "/tmp/prof")
            pstats.Stats("/tmp/prof").sort_stats("tottime").print_stats(8)
if len(sys.argv) > 3:
    pstats.Stats("/tmp/prof").print_callers("__tensor_flatten__")
    pstats.Stats("/tmp/prof").sort_stats("cumtime").print_stats(25)
