"""One attention of a left-padded batch against the same batch unpadded, on the op and on what default compile runs
(session 57: Gemma 2's left-padded prefill ran 0.83x default compile where its unpadded one ran 1.41x). Gemma 2's
shape by default: b4 x 2048, 8 query / 4 KV heads, head dim 256, softcap 50, pads 0 / 128 / 512 / 1536.

    python3 docs/scripts/padded_attention.py [b s hq hkv d softcap]

Rows (GPU ms, `timing.gpu_ms`): the op with the padding key mask (the route it takes: FA4 varlen after the host read
of the mask), the op without a mask, the op's `fa4.forward_padded` alone with the positions it reads, and eager
attention code (HF's, softcap and finfo.min mask) compiled by default torch.compile. The CPU runs it at a tiny size
as a smoke test.
"""

import sys

import torch

from fa4_inductor.bench import timing
from fa4_inductor.kernels import attention as attention_op

cuda = torch.cuda.is_available()
b, s, hq, hkv, d, softcap = (int(a) for a in sys.argv[1:6]) if len(sys.argv) > 5 else (4, 2048, 8, 4, 256, 50)
if not cuda:
    s, d = 64, 64
device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
pads = [0, s // 16, s // 4, 3 * s // 4]
positions = torch.arange(s)[None, :]
keep = (positions >= torch.tensor(pads)[:, None]).to(device)
q = torch.randn(b, s, hq, d, device=device, dtype=dtype).transpose(1, 2)
k = torch.randn(b, s, hkv, d, device=device, dtype=dtype).transpose(1, 2)
v = torch.randn(b, s, hkv, d, device=device, dtype=dtype).transpose(1, 2)
scale = d ** -0.5
flags = dict(scale=scale, causal=True, softcap=float(softcap))
op = torch.ops.fa4.attention.default


def eager(q, k, v, keep):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) * scale
    scores = torch.tanh(scores / softcap) * softcap
    visible = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()[None, None] & keep[:, None, None, :].bool()
    scores = scores + torch.zeros(visible.shape, dtype=q.dtype, device=q.device).masked_fill(
        ~visible, torch.finfo(q.dtype).min)
    return torch.softmax(scores.float(), -1).to(q.dtype) @ v


compiled_eager = torch.compile(eager)
rows = {
    "op, padding key mask": lambda: op(q, k, v, None, keep, **flags),
    "op, no mask": lambda: op(q, k, v, None, None, **flags),
    "eager code, default compile": lambda: compiled_eager(q, k, v, keep),
}
if cuda:
    from fa4_inductor.kernels import fa4

    form = attention_op.key_mask_form(q, k, None, keep, flags)
    print("key_mask_form:", form.padded and form.padded[0], "causal keys", form.causal_keys)
    rows["fa4.forward_padded alone"] = lambda: fa4.forward_padded(q, k, v, *form.padded, **flags)
with torch.no_grad():
    for name, fn in rows.items():
        fn()
        ms = timing.gpu_ms(fn) if cuda else timing.median_wall_ms(fn)
        print(f"{name:32s} {ms:8.3f} ms")
    print("route:", attention_op.kernel_for(q, k, v, keep, **flags))
