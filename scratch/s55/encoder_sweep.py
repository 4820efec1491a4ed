"""Session 55: encoder / seq2seq / vision model types through explain's phases and a training step, against eager
(dropout off): python scratch/s55/encoder_sweep.py <model type>"""
import sys, torch, traceback, warnings
warnings.filterwarnings("ignore")
import fa4_inductor
from fa4_inductor import hf, publishing
sys.path.insert(0, "scratch")
from survey_common import rel, tiny_configs_without_dropout
name = sys.argv[1]
tiny_configs_without_dropout()
try:
    impl = "sdpa" if hf.unsupported(name, "sdpa") is None else "eager"
    why = hf.unsupported(name, impl)
    if why:
        print(f"RESULT {name} skip {why[:100]}"); sys.exit()
    tiny = hf.build(name, impl)
    if tiny.kind == "causal-lm":
        print(f"RESULT {name} skip kind {tiny.kind}"); sys.exit()
    torch.manual_seed(1)
    phases = tiny.phases()
    torch._dynamo.reset()
    compiled = torch.compile(tiny.forward, backend=fa4_inductor.fa4_inductor)
    out = []
    with torch.no_grad(), publishing.collecting() as records:
        for ph, kw in phases:
            e = tiny.forward(**kw); g = compiled(**kw)
            out.append(f"{ph}:{rel(g, e):.1e}")
    rew = sum(r.rewritten for r in records); kept = [r for r in records if not r.rewritten]
    model = tiny.model; model.train()
    kw = tiny.inputs(padding=tiny.kind != "vision")
    def lg(fn):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        out = fn(**kw).float()
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))  # a LayerNorm's output squared
        l = (out * weights).sum(); l.backward()  # sums to a constant: its gradient would be rounding noise
        return l.detach(), [p.grad.clone() if p.grad is not None else None for p in model.parameters()]
    el, eg = lg(tiny.forward)
    torch._dynamo.reset()
    with publishing.collecting() as trecords:
        cl, cg = lg(torch.compile(tiny.forward, backend=fa4_inductor.fa4_inductor))
    gerr = max((rel(c, e) for c, e in zip(cg, eg) if e is not None and c is not None), default=0)
    trew = sum(r.rewritten for r in trecords); tkept = [r for r in trecords if not r.rewritten]
    print(f"RESULT {name} {tiny.kind} {impl} layers={tiny.attention_layers} inf_rewritten={rew} kept={len(kept)} "
          f"{' '.join(out)} train_loss={rel(cl, el):.1e} train_grad={gerr:.1e} train_rewritten={trew} "
          f"train_kept={len(tkept)}")
    for r in (kept + tkept)[:4]:
        print("KEPT", name, str(r)[:300])
except SystemExit:
    raise
except Exception as ex:
    print(f"RESULT {name} ERROR {type(ex).__name__}: {str(ex)[:300]}")
    traceback.print_exc()
