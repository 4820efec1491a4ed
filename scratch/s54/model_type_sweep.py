"""Session 54's survey of causal LM types, and session 55's of encoders, encoder-decoders and speech models
(`--encoders`, dropout off): python scratch/s54/model_type_sweep.py <model type> [--no-dropout] [--encoders]"""
import sys, torch, traceback, warnings
warnings.filterwarnings("ignore")
import fa4_inductor
from fa4_inductor import hf, publishing
sys.path.insert(0, "scratch")
from survey_common import rel, tiny_configs_without_dropout
name = sys.argv[1]
encoders = "--encoders" in sys.argv
if "--no-dropout" in sys.argv or encoders:  # dropout and router jitter off (active in training, Inductor's RNG is
    tiny_configs_without_dropout()  # not eager's)
try:
    impl = "sdpa" if hf.unsupported(name, "sdpa") is None else "eager"
    why = hf.unsupported(name, impl)
    if why:
        print(f"RESULT {name} skip {why[:100]}"); sys.exit()
    tiny = hf.build(name, impl)
    if (tiny.kind == "causal-lm") == encoders:
        print(f"RESULT {name} skip kind {tiny.kind}"); sys.exit()
    torch.manual_seed(1)
    phases = tiny.phases()
    torch.manual_seed(1)
    eager_phases = tiny.phases()  # a StaticCache of their own
    torch._dynamo.reset()
    compiled = torch.compile(tiny.forward, backend=fa4_inductor.fa4_inductor)
    out = []
    with torch.no_grad(), publishing.collecting() as records:
        for (ph, kw), (_, ekw) in zip(phases, eager_phases):
            e = tiny.forward(**ekw); g = compiled(**kw)
            out.append(f"{ph}:{rel(g, e):.1e}")
    rew = sum(r.rewritten for r in records); kept = [r for r in records if not r.rewritten]
    # training step: a left-padded one with labels (causal LMs), else right-padded under a fixed random projection of
    # the output (a LayerNorm's output squared sums to a constant: its gradient would be rounding noise)
    model = tiny.model; model.train()
    if encoders:
        kw = tiny.inputs(padding=tiny.kind != "vision")
    else:
        kw = tiny.inputs(seq=12, padding=True); kw["attention_mask"] = kw["attention_mask"].flip(-1)
        kw["labels"] = kw["input_ids"]; kw["use_cache"] = False
    def lg(fn):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        if encoders:
            out = fn(**kw).float()
            l = (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(5))).sum()
        else:
            l = fn(**kw).loss
        l.backward()
        return l.detach(), [p.grad.clone() if p.grad is not None else None for p in model.parameters()]
    step = tiny.forward if encoders else model
    el, eg = lg(step)
    torch._dynamo.reset()
    with publishing.collecting() as trecords:
        cl, cg = lg(torch.compile(step, backend=fa4_inductor.fa4_inductor))
    gerr = max((rel(c, e) for c, e in zip(cg, eg) if e is not None and c is not None), default=0)
    trew = sum(r.rewritten and (encoders or r.family == "sdpa") for r in trecords)
    print(f"RESULT {name} {tiny.kind} {impl} layers={tiny.attention_layers} inf_rewritten={rew} kept={len(kept)} "
          f"{' '.join(out)} train_loss={rel(cl, el):.1e} train_grad={gerr:.1e} train_rewritten={trew}")
    for r in (kept + [r for r in trecords if not r.rewritten])[:4]:
        print("KEPT", name, str(r)[:300])
except SystemExit:
    raise
except Exception as ex:
    print(f"RESULT {name} ERROR {type(ex).__name__}: {str(ex)[:300]}")
    traceback.print_exc()
