"""Session 23 (for the next device run): a Mistral model of the Llama-1B shape (or smaller: argv `tiny` on the CPU)
with a sliding window, sdpa and eager code: `generate(cache_implementation="static", max_new_tokens=1)` of a 4 x S
left-padded batch with `model.forward` compiled (its prefill gets generate's masks built outside the forward; the
sliding layers' is causal & window & left padding, now read by the op as FA4 varlen with a window): the first
token's scores against uncompiled generate, and ms, ours against default compile."""
import sys, torch
from transformers import MistralConfig, MistralForCausalLM
from fa4_inductor.bench import models, timing

tiny = sys.argv[1:] == ["tiny"]
device = "cpu" if tiny else "cuda"
shape = {**models.LLAMA_1B, **(dict(models.llama_shape(256, 2), vocab_size=1000) if tiny else {})}
seq, window = (64, 16) if tiny else (4096, 1024)
config = MistralConfig(**{k: v for k, v in shape.items() if k != "rope_theta"}, sliding_window=window)
for attention in ("sdpa", "eager"):
    config._attn_implementation = attention
    with torch.device(device):
        model = MistralForCausalLM(config).to(torch.float32 if tiny else torch.bfloat16).eval()
    tokens, mask = models.padded_batch(config.vocab_size, 4, seq, tuple(p * seq // 4096 for p in (0, 100, 700, 1500)),
                                       device, "left")
    kwargs = dict(attention_mask=mask, max_new_tokens=1, do_sample=False, cache_implementation="static",
                  pad_token_id=0, return_dict_in_generate=True, output_scores=True)
    forward = model.forward
    with torch.no_grad():
        expected = model.generate(tokens, **kwargs).scores[0].float()
        for name, backend in models.BACKENDS.items():
            torch._dynamo.reset()
            model.forward = models.compile_model(forward, backend)
            try:
                got = model.generate(tokens, **kwargs).scores[0].float()
                ms = timing.median_wall_ms(lambda: model.generate(tokens, **kwargs), repeats=5)
            finally:
                model.forward = forward
            print(f"{attention} code, window {window}, static-cache generate's prefill 4 x {seq} | {name} | {ms:.2f} ms | "
                  f"first scores vs uncompiled: {(got - expected).abs().max().item():.3g}", flush=True)
    del model
