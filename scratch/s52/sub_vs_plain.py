import time, sys, copy, torch, torch.nn as nn, cProfile, pstats
import fa4_inductor
from fa4_inductor import int8
from torchao.quantization import quantize_, Int8WeightOnlyConfig
torch.manual_seed(0)
L = 112
model = nn.Sequential(*[nn.Linear(16, 16, bias=False) for _ in range(L)]).to(torch.bfloat16).requires_grad_(False)
quantize_(model, Int8WeightOnlyConfig(set_inductor_config=False))
plain = copy.deepcopy(model); int8.from_torchao(plain)
x = torch.randn(1, 16, dtype=torch.bfloat16)
for name, m in [("subclass", model), ("plain", plain)]:
    torch._dynamo.reset()
    f = torch.compile(m, backend=fa4_inductor.backend(int8_linear=False))
    with torch.no_grad():
        for _ in range(3): f(x)
        res = []
        for r in range(5):
            t = time.perf_counter()
            for _ in range(200): f(x)
            res.append((time.perf_counter()-t)/200*1e3)
        print(name, f"min {min(res):.3f} ms/call")
        if len(sys.argv) > 1:
            cProfile.run("for _ in range(50): f(x)", "/tmp/prof")
            pstats.Stats("/tmp/prof").sort_stats("tottime").print_stats(12)
