"""Model-style attention modules, compiled with the backend (Inductor included): every attention
layer reaches `fa4::attention` with K/V un-repeated, and outputs match eager."""

import pytest
import torch
import torch.nn as nn

from fa4_inductor.demo import Config, TinyLlama
import upstream
from helpers import Recorder


def hf_llama(attn_implementation):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                      num_attention_heads=8, num_key_value_heads=2,
                                      attn_implementation=attn_implementation)
    model = transformers.LlamaForCausalLM(config).eval()
    return lambda tokens, **kw: model(tokens, **kw).logits


MODELS = {
    # name: (builder, input maker, attention layers)
    "nanogpt_manual": (lambda: nn.Sequential(upstream.CausalSelfAttention(), upstream.CausalSelfAttention()).eval(),
                       lambda: (torch.randn(2, 11, 32),), 2),
    "nanogpt_flash": (lambda: nn.Sequential(*(upstream.CausalSelfAttention(flash=True) for _ in range(2))).eval(),
                      lambda: (torch.randn(2, 11, 32),), 2),
    "gpt_fast": (lambda: nn.Sequential(upstream.GptFastAttention(), upstream.GptFastAttention()),
                 lambda: (torch.randn(2, 9, 64),), 2),
    "hf_llama_eager": (lambda: hf_llama("eager"), lambda: (torch.randint(0, 128, (2, 10)),), 3),
    "hf_llama_sdpa": (lambda: hf_llama("sdpa"), lambda: (torch.randint(0, 128, (2, 10)),), 3),
    "tiny_llama_eager": (lambda: TinyLlama(Config(attention="eager")).eval(), lambda: (torch.randint(0, 512, (1, 24)),), 2),
}


@pytest.mark.parametrize("name", MODELS)
def test_every_attention_layer_is_rewritten(name):
    build, make_inputs, layers = MODELS[name]
    torch.manual_seed(0)
    model, args = build(), make_inputs()
    torch._dynamo.reset()
    recorder = Recorder(inductor=True)
    with torch.no_grad():
        got = torch.compile(model, backend=recorder)(*args)
        expected = model(*args)
    assert recorder.count() == layers, [str(r) for r in recorder.records]
    assert all(r.rewritten for r in recorder.records)
    gqa_models = {"gpt_fast", "hf_llama_eager", "hf_llama_sdpa", "tiny_llama_eager"}
    for graph in recorder.graphs:
        for node in graph.graph.nodes:
            if node.target is torch.ops.fa4.attention.default and name in gqa_models:
                q, k = (a.meta["example_value"] for a in node.args[:2])
                assert q.shape[1] == 4 * k.shape[1]  # K/V arrive un-repeated
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_hf_left_padding_is_rewritten_with_a_key_mask_or_stopped_under_checked_padding():
    """Causal + left padding: by default the op takes the mask as its key_mask and matches eager (rows
    that see no key included); opted in with checked_padding=True, it is rewritten with a run-time check
    that the mask hides nothing (it does here, so the call stops)."""
    model = hf_llama("eager")
    tokens = torch.randint(0, 128, (2, 10))
    padding = torch.ones(2, 10, dtype=torch.long)
    padding[1, :3] = 0
    torch._dynamo.reset()
    with torch.no_grad(), pytest.raises(RuntimeError, match="hides keys that the causal mask shows"):
        torch.compile(model, backend=Recorder(checked_padding=True))(tokens, attention_mask=padding)
    torch._dynamo.reset()
    recorder = Recorder()
    with torch.no_grad():
        got = torch.compile(model, backend=recorder)(tokens, attention_mask=padding)
        torch.testing.assert_close(got, model(tokens, attention_mask=padding))
    assert recorder.count() == 3 and not recorder.reasons, recorder.reasons
    assert all("key_mask=padding mask, rows that see no key: mean of V" in r.detail for r in recorder.records)


@pytest.mark.slow
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_hf_llama_with_dynamic_true_is_rewritten_once(attention):
    """dynamic=True hands `self.scaling` over as a runtime float; the rewrite takes it, Inductor's
    scalar pass then specializes it (one restart), and a new length runs without recompiling."""
    model = hf_llama(attention)
    torch._dynamo.reset()
    recorder = Recorder(inductor=True)
    compiled = torch.compile(model, backend=recorder, dynamic=True)
    with torch.no_grad():
        for length in (10, 17):
            tokens = torch.randint(0, 128, (2, length))
            torch.testing.assert_close(compiled(tokens), model(tokens), atol=1e-4, rtol=1e-4)
    assert len(recorder.graphs) == 1 and recorder.count() == 3
    assert all(r.rewritten for r in recorder.records), [str(r) for r in recorder.records]
