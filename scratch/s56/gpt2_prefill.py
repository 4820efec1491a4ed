"""Session 56: GPT-2 small's b1 x 1024 prefill ran 0.74x on the families suite (H100): the two backends timed in
alternating rounds, and what ours did with each attention."""
import torch, warnings
warnings.filterwarnings("ignore")
import fa4_inductor
from fa4_inductor import bench, publishing
from fa4_inductor.bench import timing

fam = bench.families.FAMILIES["gpt2"]
model = fam.build("cuda", torch.bfloat16)
tokens = torch.randint(1, 32000, (1, 1024), device="cuda")
for kw in (dict(), dict(use_cache=False)):
    fns = {}
    torch._dynamo.reset()  # both backends' entries side by side after it (Dynamo guards on the backend)
    for name in ("default", "ours"):
        with publishing.collecting() as recs:
            c = torch.compile(model, backend=fa4_inductor.fa4_inductor) if name == "ours" else torch.compile(model)
            with torch.no_grad():
                for _ in range(3):
                    c(tokens, logits_to_keep=1, **kw)
        if name == "ours":
            print(kw, [str(r)[:250] for r in recs[:2]], len(recs))
        fns[name] = (lambda c=c: c(tokens, logits_to_keep=1, **kw))
        with torch.no_grad():
            print(kw, name, "alone", timing.median_wall_ms(fns[name], repeats=21))
    with torch.no_grad():
        print(kw, "interleaved", timing.interleaved_median_ms(fns, rounds=30))
