"""Session 23: eager attention code's mask input (static-cache generate) on the H200, `additive_masks_on_op` off / on
against default compile: every row's logits against uncompiled eager (pad rows included: aten SDPA's efficient
kernel gave zeros for rows whose keys are all finfo.min), the padded prefill's time, generate's decode rate."""
import sys, torch, fa4_inductor
import torch.nn.functional as F
from fa4_inductor.bench import llama_e2e, models, padded

part = sys.argv[1] if len(sys.argv) > 1 else "all"
BACKENDS = {"default": "inductor", "ours, option off": fa4_inductor.backend(additive_masks_on_op=False),
            "ours (option on)": "fa4_inductor"}
if len(sys.argv) > 2:
    BACKENDS = {name: BACKENDS[name] for name in sys.argv[2].split("|")}
if part in ("all", "sdpa"):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    m = torch.zeros(2, 1, 64, 64, device="cuda", dtype=torch.bfloat16)
    m.masked_fill_(torch.ones(64, 64, dtype=torch.bool, device="cuda").triu(1), torch.finfo(torch.bfloat16).min)
    m[:, :, :, :8] = torch.finfo(torch.bfloat16).min  # 8 pad keys: rows 0..7 see only finfo.min
    eager = torch.softmax(q.float() @ k.float().transpose(-1, -2) / 8 + m.float(), -1) @ v.float()
    B = torch.nn.attention.SDPBackend
    for name, backend in (("default", None), ("math", B.MATH), ("efficient", B.EFFICIENT_ATTENTION), ("cudnn", B.CUDNN_ATTENTION)):
        for floor in (None, -torch.finfo(torch.float32).max / 2):
            try:
                with torch.nn.attention.sdpa_kernel(backend) if backend else torch.no_grad():
                    o = F.scaled_dot_product_attention(q, k, v, attn_mask=m if floor is None else m.clamp_min(floor))
                print("aten sdpa", name, "mask floored at", floor, "| rows seeing only finfo.min: error",
                      round((o[:, :, :8].float() - eager[:, :, :8]).abs().max().item(), 4),
                      "| other rows", round((o[:, :, 8:].float() - eager[:, :, 8:]).abs().max().item(), 4), flush=True)
            except Exception as e:
                print("aten sdpa", name, "error", type(e).__name__, str(e)[:150], flush=True)
model = models.llama("eager", "cuda", torch.bfloat16)
if part in ("all", "prefill"):
    tokens, mask = models.padded_batch(model.config.vocab_size, 4, 2048, (0, 100, 700, 1500), "cuda", "left")
    with torch.no_grad():
        ref = model(tokens, **padded.static_cache_prefill(model, tokens, mask, 4096)).logits.float()
        pad = mask == 0
        for name, backend in BACKENDS.items():
            torch._dynamo.reset()
            got = models.compile_model(model, backend)(tokens, **padded.static_cache_prefill(model, tokens, mask, 4096)).logits.float()
            print("eager code, static-cache padded prefill 4 x 2048 |", name, "| logits vs eager: pad rows",
                  round((got[pad] - ref[pad]).abs().max().item(), 3), "| other rows", round((got[~pad] - ref[~pad]).abs().max().item(), 3), flush=True)
    for name, backend in BACKENDS.items():
        torch._dynamo.reset()
        print("eager code, static-cache padded prefill 4 x 2048 |", name, "|",
              round(padded.padded_ms(model, backend, tokens, mask, False, static_cache=4096), 2), "ms", flush=True)
if part in ("all", "generate"):
    for name, backend in BACKENDS.items():
        torch._dynamo.reset()
        first, rate, _ = llama_e2e.generate_times(model, backend, 1024, 64, 4, "cuda")
        print("eager code, generate b4 x 1024 + 64 |", name, "| first token", round(first, 1), "ms |", round(rate), "tokens/s", flush=True)
