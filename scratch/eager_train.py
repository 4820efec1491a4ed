"""Session 24 (for the next device run): eager code's padded training step, now on the op (rows that see no key get
eager's gradient from `blind_rows_as_eagers`; was: kept as written). Llama-1B shape, eager code, 4 x 1024, left- and
right-padded (0/100/300/700 pad tokens), labels on every position: loss and the gradient of the embedding against
uncompiled eager, ms and peak memory, default compile against ours. Argv `tiny` runs a small model on the CPU; else
argv: the length (default 1024) and the sides (default left,right)."""
import sys, torch
from fa4_inductor.bench import models, timing

tiny = sys.argv[1:] == ["tiny"]
device = "cpu" if tiny else "cuda"
overrides = dict(models.llama_shape(256, 2), vocab_size=1000) if tiny else {}
model = models.llama("eager", device, torch.float32 if tiny else torch.bfloat16, **overrides).train()
seq = 64 if tiny else int((sys.argv[1:] or ["1024"])[0])
for side in ("left", "right") if tiny or len(sys.argv) < 3 else sys.argv[2].split(","):
    tokens, mask = models.padded_batch(model.config.vocab_size, 4, seq, tuple(p * seq // 1024 for p in (0, 100, 300, 700)),
                                       device, side)

    def step(fn):
        model.zero_grad(set_to_none=True)
        loss = fn(tokens, attention_mask=mask, labels=tokens, use_cache=False).loss
        loss.backward()
        return loss.detach().float(), model.model.embed_tokens.weight.grad.float()

    loss_ref, grad_ref = step(model)
    for name, backend in models.BACKENDS.items():
        torch._dynamo.reset()
        compiled = models.compile_model(model, backend)
        loss, grad = step(compiled)
        if not tiny:
            torch.cuda.reset_peak_memory_stats()
        ms = timing.median_wall_ms(lambda: step(compiled), repeats=5)
        peak = 0 if tiny else torch.cuda.max_memory_allocated() / 2**30
        print(f"eager code, {side}-padded training step 4 x {seq} | {name} | {ms:.2f} ms | peak {peak:.1f} GiB | loss vs "
              f"uncompiled {(loss - loss_ref).abs().item():.3g} | embedding grad vs uncompiled "
              f"{(grad - grad_ref).abs().max().item():.3g} (max {grad_ref.abs().max().item():.3g})", flush=True)
