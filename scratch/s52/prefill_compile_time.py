"""CPU: compile time of a small Llama's 1024-token prefill with fp8 weights as plain buffers (fp8.from_torchao), ours
against default compile (session 52: the H100's fp8 plain prefill row did not finish within 330 s)."""
import sys, time, torch, torch.nn as nn
from torchao.quantization import quant_api, quantize_
import torchao.quantization as q
import fa4_inductor
from fa4_inductor import fp8
from fa4_inductor.bench import models
quant_api._check_hardware_support = lambda g: None
torch.manual_seed(0)
over = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=int(sys.argv[1]) if len(sys.argv) > 1 else 4,
            num_attention_heads=8, num_key_value_heads=2, vocab_size=4096)
model = models.llama("sdpa", "cpu", torch.bfloat16, **over).requires_grad_(False)
quantize_(model, q.Float8DynamicActivationFloat8WeightConfig(granularity=q.PerRow(), set_inductor_config=False),
          filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and "lm_head" not in fqn)
fp8.from_torchao(model)
tokens = torch.randint(0, 4096, (1, 1024))
for name, be in [("default", "inductor"), ("ours", fa4_inductor.fa4_inductor)]:
    torch._dynamo.reset()
    f = torch.compile(model, backend=be, dynamic=False)
    t = time.perf_counter()
    with torch.no_grad():
        f(tokens, logits_to_keep=64)
    print(name, f"first call {time.perf_counter() - t:.1f} s", flush=True)
