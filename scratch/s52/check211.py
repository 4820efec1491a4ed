import time, torch, torch.nn as nn, cProfile, pstats
import fa4_inductor
from fa4_inductor.lowering import subclass_weights as sw
from torch.testing._internal.two_tensor import TwoTensor
orig = sw.take_inner_tensors
def spy(gm, inputs):
    for n in gm.graph.find_nodes(op="placeholder"):
        print("ph", n.name, n.meta.get("tensor_dict"), getattr(n, "_dynamo_source", None))
    r = orig(gm, inputs); print("taken:", None if r is None else r[2].inner_names); return r
sw.take_inner_tensors = spy
import importlib; importlib.import_module("fa4_inductor.backend").take_inner_tensors = spy
model = nn.Sequential(*[nn.Linear(16, 16, bias=False) for _ in range(3)])
for m in model: m.weight = nn.Parameter(TwoTensor(torch.randn(16, 16), torch.randn(16, 16)), requires_grad=False)
x = torch.randn(2, 16)
with torch.no_grad():
    f = torch.compile(model, backend=fa4_inductor); f(x)
    torch.testing.assert_close(f(x), model(x)); print("ok")
