"""Session 55: generate over a compiled forward (greedy, beam search, static cache; a left-padded batch) for the
decoders hf built as encoders until now: tokens against uncompiled generate. python scratch/s55/generate_check.py"""
import sys, torch, warnings
warnings.filterwarnings("ignore")
import fa4_inductor
from fa4_inductor import hf, publishing
for name in sys.argv[1:] or ["gpt_neo", "gpt_bigcode", "ctrl", "mpt", "openai-gpt"]:
    impl = "sdpa" if hf.unsupported(name, "sdpa") is None else "eager"
    model = hf.build(name, impl).model
    model.generation_config.pad_token_id = 0
    ids = torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    for strategy, kw in (("greedy", {}), ("beam", {"num_beams": 2}), ("static", {"cache_implementation": "static"})):
        forward = model.forward
        torch._dynamo.reset()
        model.__dict__.pop("_cache", None)
        try:
            with torch.no_grad():
                expected = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, **kw)
                model.__dict__.pop("_cache", None)
                model.forward = torch.compile(forward, backend=fa4_inductor.fa4_inductor)
                with publishing.collecting() as records:
                    got = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, **kw)
            rew = sum(r.rewritten for r in records)
            print(f"GEN {name} {impl} {strategy} same={torch.equal(got, expected)} rewritten={rew} kept={len(records) - rew}",
                  flush=True)
        except Exception as e:
            print(f"GEN {name} {impl} {strategy} ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
        finally:
            model.forward = forward
