"""Attention that reaches Dynamo's graph as one opaque call (nn.MultiheadAttention's functional, torch's
flex_attention): kept as written, each call with a record that says why, and outputs and gradients eager's."""

import expecttest
import pytest
import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from helpers import Recorder, compile_and_record


class SelfAttention(nn.Module):
    """torchvision's ViT encoder block's call: batch-first self-attention, the weights not asked for."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x, key_padding_mask=None):
        return self.attn(x, x, x, key_padding_mask=key_padding_mask, need_weights=False)[0]


def padded(batch=2, seq=12):
    mask = torch.zeros(batch, seq, dtype=torch.bool)
    mask[1, seq - 5:] = True  # True: a key to ignore
    return mask


class TestOpaqueAttention(expecttest.TestCase):
    def test_multihead_attention_is_kept_with_its_reason(self):
        torch.manual_seed(0)
        model = SelfAttention().eval()
        x = torch.randn(2, 12, 32)
        with torch.no_grad():
            rec, out = compile_and_record(model, x, padded())
            reference = model.double()(x.double(), padded())
        torch.testing.assert_close(out.double(), reference, atol=1e-5, rtol=1e-5)
        self.assertExpectedInline("\n".join(map(str, rec.records)), """[kept] opaque_attention attn (test_opaque_attention.py:21 in forward): nn.MultiheadAttention's F.multi_head_attention_forward is one call in Dynamo's graph (projections, masks and attention inside it), which this backend opens only for plain self-attention (one input, no mask, need_weights=False, no bias_k / bias_v, no dropout in training): kept as written""")
        assert rec.summary == "", rec.summary  # nothing added to the graph

    def test_flex_attention_is_kept_with_its_reason(self):
        torch.manual_seed(0)
        q, k, v = (torch.randn(2, 4, 128, 16) for _ in range(3))
        causal = create_block_mask(lambda b, h, i, j: i >= j, None, None, 128, 128, device="cpu")

        def fn(q, k, v):
            return flex_attention(q, k, v, block_mask=causal)

        with torch.no_grad():
            rec, out = compile_and_record(fn, q, k, v)
        weights = (q.double() @ k.double().mT / 4).masked_fill(~torch.ones(128, 128).tril().bool(), float("-inf"))
        torch.testing.assert_close(out.double(), weights.softmax(-1) @ v.double(), atol=1e-5, rtol=1e-5)
        assert [r.rewritten for r in rec.records] == [False], rec.records
        assert rec.records[0].family == "opaque_attention"
        assert rec.records[0].detail.startswith("flex_attention's score_mod / block_mask programs are not read")
        assert rec.records[0].location.startswith("test_opaque_attention.py:"), rec.records[0].location


def test_multihead_attention_training_step_matches_eager():
    """The kept call trains as eager does: the loss's gradients of x and of every parameter."""
    torch.manual_seed(1)
    model = SelfAttention().train()
    x = torch.randn(2, 12, 32, requires_grad=True)

    def grads(fn):
        model.zero_grad()
        x.grad = None
        fn(x, padded()).square().mean().backward()
        return [x.grad.clone()] + [p.grad.clone() for p in model.parameters()]

    eager = grads(model)
    torch._dynamo.reset()
    recorder = Recorder()
    for got, want in zip(grads(torch.compile(model, backend=recorder)), eager):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert [(r.family, r.rewritten) for r in recorder.records] == [("opaque_attention", False)], recorder.records


@pytest.mark.parametrize("impl", ["flex_attention"])
def test_hf_decoder_with_flex_attention_code_says_why(impl):
    """transformers' flex_attention code: every layer's call kept with the reason, logits eager's (no_grad: torch's
    flex_attention has no CPU backward)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(2)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=300, attn_implementation=impl)
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 300, (2, 32))
    torch._dynamo.reset()
    recorder = Recorder()
    with torch.no_grad():
        eager = model(ids, use_cache=False).logits
        got = torch.compile(model, backend=recorder)(ids, use_cache=False).logits
    torch.testing.assert_close(got, eager, atol=1e-5, rtol=1e-5)
    assert [(r.module, r.rewritten) for r in recorder.records] == \
        [(f"layers.{i}.self_attn", False) for i in range(2)], recorder.records
    assert all("flex_attention's score_mod" in r.detail for r in recorder.records)
