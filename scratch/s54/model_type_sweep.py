"""Session 54's survey of causal LM types: python scratch/s54/model_type_sweep.py <model type> [--no-dropout]"""
import sys, torch, traceback, warnings
warnings.filterwarnings("ignore")
import fa4_inductor
from fa4_inductor import hf, publishing
sys.path.insert(0, "scratch")
from survey_common import rel, tiny_configs_without_dropout
name = sys.argv[1]
if "--no-dropout" in sys.argv:  # dropout and router jitter off (active in training, Inductor's RNG is not eager's)
    tiny_configs_without_dropout()
try:
    impl = "sdpa" if hf.unsupported(name, "sdpa") is None else "eager"
    why = hf.unsupported(name, impl)
    if why:
        print(f"RESULT {name} skip {why[:100]}"); sys.exit()
    tiny = hf.build(name, impl)
    if tiny.kind != "causal-lm":
        print(f"RESULT {name} skip kind {tiny.kind}"); sys.exit()
    torch.manual_seed(1)
    phases = tiny.phases()
    torch.manual_seed(1)
    eager_phases = tiny.phases()
    torch._dynamo.reset()
    compiled = torch.compile(tiny.forward, backend=fa4_inductor.fa4_inductor)
    out = []
    with torch.no_grad(), publishing.collecting() as records:
        for (ph, kw), (_, ekw) in zip(phases, eager_phases):
            e = tiny.forward(**ekw); g = compiled(**kw)
            out.append(f"{ph}:{rel(g, e):.1e}")
    rew = sum(r.rewritten for r in records); kept = [r for r in records if not r.rewritten]
    # training step
    model = tiny.model; model.train()
    kw = tiny.inputs(seq=12, padding=True); kw["attention_mask"] = kw["attention_mask"].flip(-1)
    kw["labels"] = kw["input_ids"]; kw["use_cache"] = False
    def lg(m):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        l = m(**kw).loss; l.backward()
        return l.detach(), [p.grad.clone() if p.grad is not None else None for p in model.parameters()]
    el, eg = lg(model)
    torch._dynamo.reset()
    with publishing.collecting() as trecords:
        cl, cg = lg(torch.compile(model, backend=fa4_inductor.fa4_inductor))
    gerr = max((rel(c, e) for c, e in zip(cg, eg) if e is not None), default=0)
    trew = sum(r.rewritten and r.family == "sdpa" for r in trecords)
    print(f"RESULT {name} {impl} layers={tiny.attention_layers} inf_rewritten={rew} kept={len(kept)} {' '.join(out)} "
          f"train_loss={rel(cl, el):.1e} train_grad={gerr:.1e} train_rewritten={trew}")
    for r in kept[:3]:
        print("KEPT", name, str(r)[:200])
except SystemExit:
    raise
except Exception as ex:
    print(f"RESULT {name} ERROR {type(ex).__name__}: {str(ex)[:300]}")
    traceback.print_exc()
