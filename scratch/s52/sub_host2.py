import time, sys, torch, torch.nn as nn
import fa4_inductor
from torchao.quantization import quantize_, Int8WeightOnlyConfig
torch.manual_seed(0)
L = 112
model = nn.Sequential(*[nn.Linear(16, 16, bias=False) for _ in range(L)]).to(torch.bfloat16).requires_grad_(False)
quantize_(model, Int8WeightOnlyConfig())
x = torch.randn(1, 16, dtype=torch.bfloat16)
fs = {}
for name, be in [("default", "inductor"), ("ours", fa4_inductor.backend(int8_linear=False))]:
    torch._dynamo.reset()
    f = torch.compile(model, backend=be)
    with torch.no_grad():
        for _ in range(3): f(x)
    fs[name] = f
    res = []
    with torch.no_grad():
        for r in range(7):
            t = time.perf_counter()
            for _ in range(200): f(x)
            res.append((time.perf_counter()-t)/200*1e3)
    print(name, f"min {min(res):.3f} median {sorted(res)[3]:.3f} ms/call")
