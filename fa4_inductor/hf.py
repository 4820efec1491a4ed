"""Small HuggingFace transformers models built from a config (random weights, nothing downloaded).

    tiny = hf.build("llama", "sdpa")          # any model type transformers knows, or a local config path
    tiny.model(*tiny.inputs(), **tiny.kwargs())  # what `explain hf:llama` and tests/test_model_zoo.py run

The config is the model type's default, shrunk (2 layers, hidden 64, 4 heads of 16, 2 KV heads where
the model has GQA, sliding window 4 where it has one) so a CPU builds and runs it in a second.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass

import torch

TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64)
# Set only where the default config has the attribute (None counts as absent: the feature is off).
TINY_IF_PRESENT = dict(num_key_value_heads=2, head_dim=16, sliding_window=4, decoder_layers=2, encoder_layers=2,
                       num_decoder_layers=2, decoder_attention_heads=4, encoder_attention_heads=4, encoder_ffn_dim=128,
                       decoder_ffn_dim=128, image_size=32, patch_size=8)
# Models whose attention shapes come from other fields: DeepSeek's MLA (q / k heads of nope + rope dims, v of its own,
# the rotary embedding over the rope dims), GPT-J's partial rotary.
TINY_BY_MODEL = {
    "deepseek_v3": dict(num_key_value_heads=4, qk_rope_head_dim=8, qk_nope_head_dim=16, qk_head_dim=24, head_dim=8,
                        v_head_dim=16, kv_lora_rank=32, q_lora_rank=None, n_routed_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1, n_shared_experts=1),
    "deepseek_v2": dict(num_experts_per_tok=2),  # None in its default config, which the model cannot run
    "gptj": dict(rotary_dim=8),
    "whisper": dict(max_source_positions=16, num_mel_bins=16),  # 32 frames of 16 mel bins (default 3000 of 80)
    "codegen": dict(rotary_dim=8),
    "nemotron": dict(num_key_value_heads=2),  # its default config leaves it None, which the model cannot build
    "dots1": dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1,
                  n_group=1, topk_group=1, n_shared_experts=1),  # its default leaves the expert count None
    # Gemma 3n: per-layer lists sized for its 35 layers; its second layer reuses the first one's K/V (KV sharing)
    "gemma3n_text": dict(intermediate_size=[128, 128], layer_types=["sliding_attention", "sliding_attention"],
                         num_kv_shared_layers=1, activation_sparsity_pattern=[0.0, 0.0], laurel_rank=8,
                         hidden_size_per_layer_input=16, vocab_size_per_layer_input=128),
}
# Multi-head latent attention (DeepSeek V2 / V3.2, GLM-MoE-DSA, ...): its head dims and ranks, and the experts MLA
# models pair it with, set where the default config has them (not None); TINY_BY_MODEL's entries come after.
TINY_MLA = dict(num_key_value_heads=4, qk_rope_head_dim=8, qk_nope_head_dim=16, qk_head_dim=24, head_dim=8,
                v_head_dim=16, kv_lora_rank=32, q_lora_rank=32, n_routed_experts=4, num_experts=4,
                num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1, n_group=1, topk_group=1,
                n_shared_experts=1, index_head_dim=16, index_n_heads=4)
# Configs with per-layer attributes (`per_layer_config`: Gemma 4's full-attention layers have heads twice as wide as
# its sliding ones) are built again from their class with the tiny sizes and these: one sliding and one full layer.
GEMMA4_TINY = dict(global_head_dim=32, layer_types=["sliding_attention", "full_attention"],
                   hidden_size_per_layer_input=16, vocab_size_per_layer_input=128)
TINY_PER_LAYER_BY_MODEL = {"gemma4_text": GEMMA4_TINY, "gemma4_unified_text": GEMMA4_TINY}
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")


@dataclass
class Tiny:
    """A built model, what its inputs look like, and how many attention layers one forward runs."""

    model: torch.nn.Module
    kind: str  # "causal-lm", "encoder", "vision", "seq2seq"
    attention_layers: int
    language_model_of: str = ""  # the multimodal model type whose language model this is (`language_config`)

    def inputs(self, batch: int = 2, seq: int = 12, padding: bool = False, generator=None) -> dict:
        """Fresh random inputs; `padding` right-pads the encoder tokens to random lengths (at least 1)."""
        config = self.model.config
        if self.kind == "vision":
            size = config.image_size
            height, width = (size, size) if isinstance(size, int) else size
            return {"pixel_values": torch.randn(batch, config.num_channels, height, width, generator=generator)}
        if self.audio:  # Whisper: log-mel frames, twice the encoder's positions (its second conv halves them)
            frames = 2 * config.max_source_positions
            kwargs = {"input_features": torch.randn(batch, config.num_mel_bins, frames, generator=generator)}
        else:
            kwargs = {"input_ids": torch.randint(0, config.vocab_size, (batch, seq), generator=generator)}
        if padding:
            lengths = torch.randint(1, seq + 1, (batch,), generator=generator)
            lengths[0] = seq - 1  # at least one row is padded
            kwargs["attention_mask"] = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        if self.kind == "seq2seq":
            decoder_shape = (batch, max(seq - 4, 1))
            kwargs["decoder_input_ids"] = torch.randint(0, config.vocab_size, decoder_shape, generator=generator)
            if self.audio and padding:  # the audio is not masked: the decoder's tokens are padded
                kwargs["decoder_attention_mask"] = kwargs.pop("attention_mask")[:, :decoder_shape[1]]
        return kwargs

    @property
    def audio(self) -> bool:
        """Whether the model takes log-mel features of a fixed length (Whisper) in place of token ids."""
        config = self.model.config
        return getattr(self.model, "main_input_name", "") == "input_features" and \
            hasattr(config, "max_source_positions") and hasattr(config, "num_mel_bins")

    def phases(self) -> list[tuple[str, dict]]:
        """(name, inputs) of the forwards `explain` runs in order: prefill and decode through one StaticCache
        for causal LMs, then a left-padded prefill (what `generate` runs for a batch) and a forward without
        a cache (what training and evaluation loops run); plain and right-padded inputs for text encoders."""
        if self.kind == "causal-lm":
            from transformers import StaticCache

            cache = StaticCache(config=self.model.config, max_cache_len=32)
            prompt, token = self.inputs(seq=12)["input_ids"], self.inputs(seq=1)["input_ids"]
            padded = self.inputs(seq=12, padding=True)
            padded["attention_mask"] = padded["attention_mask"].flip(-1)
            keyword = cache_keyword(self.model)
            prefill, decode = positions(0, 12), positions(12, 1)
            return [("prefill", {"input_ids": prompt, keyword: cache, "use_cache": True, **prefill}),
                    ("decode", {"input_ids": token, keyword: cache, "use_cache": True, **decode}),
                    ("prefill, left-padded", padded),
                    ("forward, use_cache=False", {"input_ids": prompt, "use_cache": False})]
        if self.kind == "vision":
            return [("forward", self.inputs())]
        return [("forward", self.inputs()), ("forward, right-padded", self.inputs(padding=True))]

    def forward(self, **kwargs) -> torch.Tensor:
        out = self.model(**kwargs)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


def transformers_major() -> int:
    """The installed transformers' major version."""
    import transformers

    return int(transformers.__version__.split(".")[0])


def positions(start: int, length: int) -> dict:
    """The `cache_position` keyword generate passes with a StaticCache on transformers 4 (whose cache otherwise reads
    its length from its values, a graph break); nothing on transformers 5, which counts it in the cache."""
    return {} if transformers_major() >= 5 else {"cache_position": torch.arange(start, start + length)}


def cache_keyword(model) -> str:
    """The keyword a transformers model's forward takes its KV cache by: `cache` in the newest releases (which
    warn that `past_key_values` will be removed), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _kind(config) -> str:
    if getattr(config, "is_encoder_decoder", False):
        return "seq2seq"
    if hasattr(config, "image_size"):
        return "vision"
    architectures = " ".join(getattr(config, "architectures", None) or [])
    if getattr(config, "is_decoder", False) or "CausalLM" in architectures or _decoder_only(config):
        return "causal-lm"
    return "encoder"


def _decoder_only(config) -> bool:
    """Whether transformers builds a causal LM for `config` and no masked LM: BERT-like encoders have both (their
    causal LM class is the encoder run as a decoder); GPT-Neo, GPT-BigCode, MPT, CTRL and DBRX only the first."""
    import transformers

    return type(config) in transformers.AutoModelForCausalLM._model_mapping \
        and type(config) not in transformers.AutoModelForMaskedLM._model_mapping


def _is_model_type(name: str) -> bool:
    """Whether `name` names a transformers model type (its default config), not a local path or a Hub id."""
    import transformers

    return name in transformers.CONFIG_MAPPING and not os.path.exists(name)


def tiny_config(name: str, attn_implementation: str = "sdpa"):
    """The default config of model type `name` (or the config.json under a local path or of a Hub id), shrunk."""
    import transformers

    if _is_model_type(name):
        config = transformers.AutoConfig.for_model(name)
    else:
        config = transformers.AutoConfig.from_pretrained(name)
    config = language_config(config)
    if config.model_type in TINY_PER_LAYER_BY_MODEL:
        default = config.to_dict()  # its per-layer attributes raise on getattr
        present = {k: v for k, v in TINY_IF_PRESENT.items() if default.get(k) is not None}
        config = type(config)(**TINY, **present, **TINY_PER_LAYER_BY_MODEL[config.model_type])
    else:
        _shrink(config)
    special_tokens_within_vocabulary(config)
    config._attn_implementation = attn_implementation
    return config


def special_tokens_within_vocabulary(config) -> None:
    """Pad / bos / eos / decoder-start ids past a shrunk vocabulary moved inside it, in place."""
    for i, key in enumerate(TOKEN_IDS):
        token = getattr(config, key, None)
        if isinstance(token, int) and token >= config.vocab_size:
            setattr(config, key, i)


def _shrink(config) -> None:
    """The tiny sizes set on a default config, in place."""
    for key, v in TINY.items():
        setattr(config, key, v)
    for key, v in TINY_IF_PRESENT.items():
        current = getattr(config, key, None)
        if current is not None and _settable(config, key):  # a size per dim (YOLOS' image_size) stays one per dim
            setattr(config, key, type(current)([v] * len(current)) if isinstance(current, (list, tuple)) else v)
    if getattr(config, "head_dim", 0) is None:  # Ministral, Hunyuan: None in the config, read as is by the model
        config.head_dim = TINY["hidden_size"] // TINY["num_attention_heads"]
    _keep_an_attention_layer(config)
    if getattr(config, "qk_rope_head_dim", None) is not None:
        for key, v in TINY_MLA.items():
            if getattr(config, key, None) is not None:
                setattr(config, key, v)
    for key, v in TINY_BY_MODEL.get(config.model_type, {}).items():
        setattr(config, key, v)
    _tiny_mrope(config)


MROPE_SECTIONS = (2, 3, 3)  # (time, height, width) rotary pairs of a tiny head (16 dims: 8 pairs)
MROPE_TYPES = ("qwen2_vl_text", "qwen2_5_vl_text", "qwen3_vl_text", "glm4v_text")  # rotary over 3-D positions


def _tiny_mrope(config) -> None:
    """A multimodal rotary embedding's sections (Qwen2-VL's M-RoPE, whose model defaults them for a head of 128)
    sized for the tiny head."""
    if config.model_type not in MROPE_TYPES:
        return
    ropes = [r for r in (getattr(config, k, None) for k in ("rope_parameters", "rope_scaling")) if isinstance(r, dict)]
    if not ropes:  # transformers 4.57's default leaves rope_scaling None, which its attention reads the sections from
        config.rope_scaling = {"type": "default", "rope_type": "default"}
        ropes = [config.rope_scaling]
    for rope in ropes:  # transformers 5 / 4
        rope["mrope_section"] = list(MROPE_SECTIONS)


def language_config(config):
    """A multimodal model's language model config (its `text_config`: Gemma 3, PaliGemma, Qwen2-VL, Mllama, LLaVA),
    else the config itself. Token ids alone reach no other tower, and the composite's other configs keep their full
    sizes (a tiny text config in a 7B vision tower)."""
    if "text_config" in (getattr(type(config), "sub_configs", None) or {}) and getattr(config, "text_config", None):
        return config.text_config
    return config


def _keep_an_attention_layer(config) -> None:
    """A hybrid model whose first layers are all linear attention or state-space layers (Qwen3-Next: three linear
    to one full): its tiny layers become its first layer of another kind and its first attention layer."""
    types = getattr(config, "layer_types", None)
    layers = config.num_hidden_layers
    if not isinstance(types, (list, tuple)) or len(types) <= layers:
        return
    attends = [t for t in types if _attends(t)]
    if attends and not any(_attends(t) for t in types[:layers]):
        config.layer_types = [types[0]] * (layers - 1) + [attends[0]]


NOT_ATTENTION = ("linear", "mamba", "conv", "recurrent", "ssm")  # layer types of hybrids that are not softmax attention


def _attends(layer_type) -> bool:
    return not any(word in str(layer_type) for word in NOT_ATTENTION)


def _settable(config, key: str) -> bool:
    """Whether config.key is a plain attribute, not a property derived from others (Falcon's head_dim)."""
    attribute = getattr(type(config), key, None)
    return not isinstance(attribute, property) or attribute.fset is not None


def _auto_class(kind: str):
    import transformers

    return {"causal-lm": transformers.AutoModelForCausalLM}.get(kind, transformers.AutoModel)


def _model_class(config):
    """The model class transformers' auto classes build for `config` (`_kind`'s), or ValueError where they have none
    (Mllama's text config: only its composite has an auto class)."""
    mapping = _auto_class(_kind(config))._model_mapping
    if type(config) not in mapping:
        raise ValueError(f"transformers has no auto model class for {type(config).__name__}")
    return mapping[type(config)]


def unsupported(name: str, attn_implementation: str = "sdpa") -> str | None:
    """Why this transformers version cannot build model type `name` with that attention code (its model class
    does not declare it, e.g. Gemma2 has no sdpa attention in transformers 5; no auto class builds its config), or
    None when it can."""
    config = tiny_config(name, attn_implementation)
    try:
        model_class = _model_class(config)
    except ValueError as e:
        return str(e)
    if attn_implementation == "sdpa" and not getattr(model_class, "_supports_sdpa", False):
        import transformers

        return f"{model_class.__name__} has no sdpa attention in transformers {transformers.__version__}"
    return None


def build(name: str, attn_implementation: str = "sdpa", seed: int = 0) -> Tiny:
    """A tiny model of type `name` in eval mode; raises ValueError when the model has no such attention code
    (`unsupported` says so before building)."""
    config = tiny_config(name, attn_implementation)
    kind = _kind(config)
    torch.manual_seed(seed)
    model = _model_class(config)._from_config(config, attn_implementation=attn_implementation).eval()
    layers = config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    if kind != "seq2seq" and isinstance(types, (list, tuple)) and len(types) >= layers:
        layers = sum(_attends(t) for t in types[:layers])  # not a hybrid's linear attention or state-space layers
    if kind == "seq2seq":
        encoder = getattr(config, "encoder_layers", None) or config.num_layers  # T5 names them num_layers
        decoder = getattr(config, "decoder_layers", None) or getattr(config, "num_decoder_layers", None) or encoder
        layers = encoder + 2 * decoder  # decoder: self- and cross-attention
    composite = name if _is_model_type(name) and config.model_type != name else ""
    return Tiny(model, kind, layers, composite)
