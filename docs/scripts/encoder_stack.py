"""nn.TransformerEncoder inference (eval, no gradients: PyTorch's fused layer fast path) under our backend, which opens
each fused layer (`lowering/encoder_layer.py`), against default torch.compile, which keeps it, and eager.

A BERT-base-shaped stack (12 layers, 768 wide, 12 heads, FFN 3072, GELU, post-norm), bf16, batch x tokens, without a
mask, with a key padding mask (right-padded: each sequence a different length) and with a causal mask; ms (median,
`bench.gpu_ms`), and each compiled output's largest difference from eager's over the real (unpadded) rows.

    python3 docs/scripts/encoder_stack.py [batch tokens]    # default 8 512
"""
import sys

import torch
import torch.nn as nn

import fa4_inductor
from fa4_inductor import publishing
from fa4_inductor.bench import gpu_ms


def main():
    batch, tokens = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (8, 512)
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu", batch_first=True)
    stack = nn.TransformerEncoder(layer, 12, enable_nested_tensor=False).cuda().to(torch.bfloat16).eval()
    x = torch.randn(batch, tokens, 768, device="cuda", dtype=torch.bfloat16)
    lengths = torch.linspace(tokens // 2, tokens, batch, device="cuda").long()
    padding = torch.arange(tokens, device="cuda")[None, :] >= lengths[:, None]
    causal = torch.ones(tokens, tokens, dtype=torch.bool, device="cuda").triu(1)
    masks = {"no mask": {}, "key padding": {"src_key_padding_mask": padding}, "causal": {"mask": causal}}
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, batch {batch} x {tokens} tokens")
    print("| masks | eager ms | default compile ms | ours ms | default / ours | max error vs eager (default, ours) | "
          "our layers: on the op / routed |")
    print("|---|---|---|---|---|---|---|")
    for name, kwargs in masks.items():
        real = ~padding if "src_key_padding_mask" in kwargs else torch.ones_like(padding)
        with torch.no_grad():
            eager = stack(x, **kwargs)
            times, errors = [gpu_ms(lambda: stack(x, **kwargs))], []
            for backend in ("inductor", fa4_inductor.backend()):
                torch._dynamo.reset()
                compiled = torch.compile(stack, backend=backend)
                with publishing.collecting() as records:
                    out = compiled(x, **kwargs)
                errors.append((out.float() - eager.float())[real].abs().max().item())
                times.append(gpu_ms(lambda: compiled(x, **kwargs)))
        print(f"| {name} | {times[0]:.3f} | {times[1]:.3f} | {times[2]:.3f} | {times[1] / times[2]:.2f}x | "
              f"{errors[0]:.1e}, {errors[1]:.1e} | {sum(r.rewritten for r in records)} / "
              f"{sum(not r.rewritten for r in records)} |")


if __name__ == "__main__":
    main()
