"""What the quantized-linear and int8-KV graphs look like on this machine's torch / transformers: the aten
graph our post-grad stage sees for torchao's int8 configs and gpt-fast's int8 linear at M = 1 and 16, and
the records of an HF generate with `Int8StaticCache`. Run from the repo root: `python3 docs/scripts/quant_graphs.py`."""
import sys

import torch
import torch.nn as nn

import fa4_inductor

sys.path.insert(0, "tests")
import upstream  # noqa: E402

device = "cuda" if torch.cuda.is_available() else "cpu"
print("torch", torch.__version__, "device", device)


def show(name, model, x):
    torch._dynamo.reset()
    graphs = []

    def grab(graph):
        graphs.append(graph.python_code("self").src)

    with torch._inductor.config.patch(post_grad_custom_pre_pass=grab, fx_graph_cache=False), torch.no_grad():
        try:
            torch.compile(model)(x)
        except Exception as e:  # the graph was seen before the error, if the error is Inductor's
            print(f"{name}: {type(e).__name__}: {str(e)[:200]}")
    print(f"===== {name}\n{graphs[-1] if graphs else 'no graph'}")


def torchao_linear(config):
    from torchao.quantization import quantize_
    model = nn.Sequential(nn.Linear(2048, 512, bias=True)).to(torch.bfloat16).to(device).requires_grad_(False)
    quantize_(model, config)
    return model


from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig  # noqa: E402

for m in (1, 16):
    x = torch.randn(m, 2048, dtype=torch.bfloat16, device=device)
    show(f"torchao Int8WeightOnlyConfig M={m}", torchao_linear(Int8WeightOnlyConfig()), x)
    show(f"torchao Int8DynamicActivationInt8WeightConfig M={m}",
         torchao_linear(Int8DynamicActivationInt8WeightConfig()), x)
    show(f"gpt-fast WeightOnlyInt8Linear M={m}",
         upstream.WeightOnlyInt8Linear.from_linear(nn.Linear(2048, 512), torch.bfloat16).to(device), x)

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers import CompileConfig  # noqa: E402

config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024)
model = LlamaForCausalLM(config).to(device, torch.bfloat16).eval()
ids = torch.randint(1, 512, (2, 300), device=device)
torch._dynamo.reset()
with fa4_inductor.report.collecting() as records, torch.no_grad():
    model.generation_config.compile_config = CompileConfig(backend=fa4_inductor.fa4_inductor, fullgraph=True)
    model.generate(ids, past_key_values=fa4_inductor.Int8StaticCache(config=config, max_cache_len=512),
                   attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False, pad_token_id=0)
print("===== HF generate with Int8StaticCache: records")
for r in records:
    print("  ", str(r)[:400])
