"""torch's flex_attention, one opaque call in Dynamo's graph: kept as written with a record that says why, the
outputs eager's (nn.MultiheadAttention's opaque calls: `test_multihead_attention.py`)."""

import expecttest
import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from helpers import Recorder, compile_and_record


class TestOpaqueAttention(expecttest.TestCase):
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


@pytest.mark.slow
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
