"""Other torchao weight subclasses through the backend on CPU (eager against compiled, subclass_weights on / off)."""
import logging
import sys
import torch
import torch.nn as nn
import fa4_inductor

logging.basicConfig(level=logging.INFO)
torch.manual_seed(0)


def model_for(dtype=torch.bfloat16):
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)).to(dtype)


def check(name, make):
    for opt in (True, False):
        try:
            m = make()
        except Exception as e:  # config not available on this build
            print(f"{name}: cannot build: {type(e).__name__}: {str(e)[:200]}")
            return
        x = torch.randn(4, 256, dtype=next(m.parameters()).dtype)
        with torch.no_grad():
            ref = m(x)
            torch._dynamo.reset()
            try:
                out = torch.compile(m, backend=fa4_inductor.backend(subclass_weights=opt))(x)
                out2 = torch.compile(m, backend=fa4_inductor.backend(subclass_weights=opt))(x + 1)
                ref2 = m(x + 1)
            except Exception as e:
                print(f"{name} subclass_weights={opt}: FAILED {type(e).__name__}: {str(e)[:300]}")
                continue
        err = max((out.float() - ref.float()).abs().max().item(), (out2.float() - ref2.float()).abs().max().item())
        scale = ref.float().abs().max().item()
        print(f"{name} subclass_weights={opt}: max err {err:.3e} (scale {scale:.3e}) types "
              f"{sorted({type(p).__name__ for p in m.parameters()})}")


def torchao_cfg(cfg_name, *args, **kw):
    def make():
        import torchao.quantization as q
        m = model_for()
        q.quantize_(m, getattr(q, cfg_name)(*args, **kw))
        return m
    return make


def nf4():
    from torchao.dtypes.nf4tensor import to_nf4
    m = model_for()
    for lin in (m[0], m[2]):
        lin.weight = nn.Parameter(to_nf4(lin.weight.data), requires_grad=False)
    return m


checks = {
    "int8_dyn_act_int8_w": torchao_cfg("Int8DynamicActivationInt8WeightConfig"),
    "int8_weight_only": torchao_cfg("Int8WeightOnlyConfig"),
    "int4_weight_only": torchao_cfg("Int4WeightOnlyConfig", group_size=32),
    "float8_weight_only": torchao_cfg("Float8WeightOnlyConfig"),
    "nf4": nf4,
}
for name, make in checks.items():
    if len(sys.argv) < 2 or name in sys.argv[1:]:
        check(name, make)
