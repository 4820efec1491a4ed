"""HF transformers models with random weights (nothing downloaded) for the model-level suites, and the
one way every suite compiles them (`compile_model`: default torch.compile or our backend)."""

from __future__ import annotations

import torch

# Display name -> `compile_model`'s backend name, in the order the tables show them.
BACKENDS = {"default torch.compile": "inductor", "fa4_inductor": "fa4_inductor"}

LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256, max_position_embeddings=16384, rope_theta=500000.0,
                tie_word_embeddings=True)

BERT_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                 max_position_embeddings=512, vocab_size=30522)


def llama(attention: str, device, dtype, **overrides):
    """A Llama-1B-shaped `LlamaForCausalLM` (random weights) with the given attn_implementation."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{**LLAMA_1B, **overrides})
    config._attn_implementation = attention
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def llama_shape(hidden: int, layers: int) -> dict:
    """`llama` overrides for a Llama-1B-like model of another size: head dim 128 from hidden 2048 up, 64
    below; 4 query heads per KV head where the head count divides by 4; MLP 4x hidden."""
    head_dim = 128 if hidden >= 2048 else 64
    heads = max(1, hidden // head_dim)
    return dict(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=heads // 4 if heads % 4 == 0 else heads,
                head_dim=hidden // heads)


def bert(attention: str, device, dtype, **overrides):
    """A BERT-base-shaped `BertModel` (random weights) with the given attn_implementation."""
    from transformers import BertConfig, BertModel

    config = BertConfig(**{**BERT_BASE, **overrides})
    config._attn_implementation = attention
    with torch.device(device):
        model = BertModel(config, add_pooling_layer=False)
    return model.to(dtype).eval()


def compile_model(model_fn, backend_name, **kwargs):
    """torch.compile(model_fn) with our backend ("fa4_inductor"), a backend object (a configured
    `fa4_inductor.backend(...)`), or the default one (any other name)."""
    import fa4_inductor

    if not isinstance(backend_name, str):
        return torch.compile(model_fn, backend=backend_name, **kwargs)
    if backend_name == "fa4_inductor":
        return torch.compile(model_fn, backend=fa4_inductor, **kwargs)
    return torch.compile(model_fn, **kwargs)


def padded_batch(vocab: int, batch: int, seqlen: int, pads, device, side: str = "left"
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of a padded batch: row b starts after pads[b] pad tokens (`side` "left", what
    generate passes), or ends pads[b] tokens early ("right", fine-tuning batches)."""
    tokens = torch.randint(1, vocab, (batch, seqlen), generator=torch.Generator().manual_seed(0)).to(device)
    positions, pads = torch.arange(seqlen)[None, :], torch.tensor(pads)[:, None]
    mask = positions >= pads if side == "left" else positions < seqlen - pads
    return tokens, mask.long().to(device)
