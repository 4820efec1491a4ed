"""Multimodal and speech models reach `fa4::attention` as users call them, with outputs and gradients eager's.

Tiny transformers models built here (random weights), each with its own inputs, in eager and sdpa code, in an
inference forward and a training step with labels, on a batch whose second row is padded:

    Gemma 3 (image-text-to-text)   SigLIP vision tower; the text layers' mask lets image tokens see each other both
                                   ways (`token_type_ids`), beside causal, sliding-window and padded text
    PaliGemma                      the prefix (image and prompt) sees itself both ways, the suffix is causal
    Qwen2-VL                       M-RoPE positions (three sections), the vision tower's attention a call per image
    Whisper                        audio encoder, causal decoder with a padded `decoder_attention_mask`, cross-attention
    Mllama                         vision tower and cross-attention masks the mask reader cannot prove (kept, with
                                   their reasons); its text self-attention takes the op

A mask the graph builds from the inputs' values (the bidirectional image and prefix blocks) cannot be proven a
band, so it reaches the op as a mask read at run time ("mask per query row"): never as causal. The numerics
compare the rewritten graph (the op's CPU reference) with the uncompiled model in float32.
"""

import inspect

import pytest
import torch
import torch.nn as nn

from fa4_inductor import hf
from helpers import Recorder, assert_as_close_as_eager, loss_and_gradients

IMPLEMENTATIONS = ["eager", "sdpa"]
BATCH = 2
IMAGE_TOKEN = 299
VOCAB = 300


def _text(**extra) -> dict:
    return dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, **extra)


def gemma3(impl):
    """Four image tokens between begin / end-of-image markers, row 1 left-padded."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    config = Gemma3Config(
        text_config=_text(head_dim=16, sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=7),
        mm_tokens_per_image=4, image_token_index=IMAGE_TOKEN, boi_token_index=297, eoi_token_index=298,
        attn_implementation=impl)
    ids = torch.randint(0, 290, (BATCH, 24))
    ids[:, 1], ids[:, 2:6], ids[:, 6] = 297, IMAGE_TOKEN, 298
    mask = torch.ones_like(ids)
    mask[1, :1] = 0
    inputs = dict(input_ids=ids, pixel_values=torch.randn(BATCH, 3, 28, 28), attention_mask=mask,
                  token_type_ids=(ids == IMAGE_TOKEN).long())
    return Gemma3ForConditionalGeneration(config), inputs


def paligemma(impl):
    """16 image tokens and a prompt as the bidirectional prefix (token type 0), a causal suffix (1)."""
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

    config = PaliGemmaConfig(
        text_config=_text(model_type="gemma", head_dim=16),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=28, patch_size=7, projection_dim=64),
        image_token_index=IMAGE_TOKEN, projection_dim=64, attn_implementation=impl)
    ids = torch.randint(0, 290, (BATCH, 24))
    ids[:, 2:18] = IMAGE_TOKEN
    types = torch.zeros_like(ids)
    types[:, 20:] = 1
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    inputs = dict(input_ids=ids, pixel_values=torch.randn(BATCH, 3, 28, 28), attention_mask=mask,
                  token_type_ids=types)
    return PaliGemmaForConditionalGeneration(config), inputs


def qwen2_vl(impl):
    """One 4 x 4-patch image (merged to 4 tokens) a row, M-RoPE over (time, height, width), row 1 left-padded."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    config = Qwen2VLConfig(
        text_config=_text(rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=2,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
        image_token_id=IMAGE_TOKEN, video_token_id=298, vision_start_token_id=297, attn_implementation=impl)
    model = Qwen2VLForConditionalGeneration(config)
    ids = torch.randint(0, 290, (BATCH, 20))
    ids[:, 2], ids[:, 3:7] = 297, IMAGE_TOKEN
    mask = torch.ones_like(ids)
    mask[1, :1] = 0
    inputs = dict(input_ids=ids, pixel_values=torch.randn(BATCH * 16, 3 * 2 * 2 * 2),
                  image_grid_thw=torch.tensor([[1, 4, 4]] * BATCH), attention_mask=mask)
    if "mm_token_type_ids" in inspect.signature(model.forward).parameters:  # newer transformers want the image spans
        inputs["mm_token_type_ids"] = (ids == IMAGE_TOKEN).long()
    return model, inputs


def whisper(impl):
    """16 mel bins x 64 frames into the encoder, 12 decoder tokens, row 1's last three padded."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                           decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=32, max_target_positions=64,
                           pad_token_id=0, bos_token_id=1, decoder_start_token_id=1, eos_token_id=2,
                           attn_implementation=impl)
    ids = torch.randint(3, VOCAB, (BATCH, 12))
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    inputs = dict(input_features=torch.randn(BATCH, 16, 64), decoder_input_ids=ids, decoder_attention_mask=mask)
    return WhisperForConditionalGeneration(config), inputs


def mllama(impl):
    """One image of one tile (of 4) a row, its token at position 1, cross-attention layer 1, row 1 left-padded."""
    from transformers import MllamaConfig, MllamaForConditionalGeneration

    config = MllamaConfig(
        text_config=_text(cross_attention_layers=[1], pad_token_id=0),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_global_layers=1,
                           attention_heads=2, image_size=28, patch_size=14, max_num_tiles=4, vision_output_dim=64,
                           intermediate_layers_indices=[0]),
        image_token_index=IMAGE_TOKEN, attn_implementation=impl)
    ids = torch.randint(0, 290, (BATCH, 16))
    ids[:, 1] = IMAGE_TOKEN
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    inputs = dict(input_ids=ids, pixel_values=torch.randn(BATCH, 1, 4, 3, 28, 28),
                  aspect_ratio_ids=torch.tensor([[1]] * BATCH),
                  aspect_ratio_mask=torch.tensor([[[1, 0, 0, 0]]] * BATCH),
                  cross_attention_mask=torch.ones(BATCH, 16, 1, 4, dtype=torch.long), attention_mask=mask)
    return MllamaForConditionalGeneration(config), inputs


BUILDERS = {"gemma3": gemma3, "paligemma": paligemma, "qwen2_vl": qwen2_vl, "whisper": whisper, "mllama": mllama}

# What each model's attention layers become, in the order the graph calls them: "op" (on the op), "op, run-time
# mask" (on the op with the mask read at run time), or the start of the reason a layer is kept
SERVED = {
    # vision layer, SigLIP's pooling head (nn.MultiheadAttention's cross-attention of a probe, opened), text layers
    # (image block both ways; eager code hands them its float mask across a graph break)
    "gemma3": ["op", "op"] + ["op, run-time mask"] * 2,
    "paligemma": ["op", "op"] + ["op, run-time mask"] * 2,  # the same, the prefix both ways
    "qwen2_vl": ["op"] * BATCH + ["op"] * 2,  # vision layer (a call per image), text layers (causal, padded)
    "whisper": ["op"] * 2 + ["op"] * 4,  # encoder layers; decoder self- and cross-attention
    # the vision tower's local and global layers (mask from a matmul of tile masks), text self-attention, then
    # cross-attention (mask multiplied in place by the tiles' mask)
    "mllama": {"sdpa": ["mask not recognized: the mask is built by matmul"] * 2 + ["op"]
               + ["mask not recognized: the mask is built by imul"],
               "eager": ["mask not recognized: attention_mask_2, which it is built from, is updated in place"] * 2
               + ["op"] + ["mask not recognized: the mask is built by imul"]},
}


def build(name: str, impl: str, seed: int = 0):
    """(model, inputs) of BUILDERS[name] in attention code `impl`, dropout off."""
    pytest.importorskip("transformers")
    if name == "mllama" and hf.transformers_major() < 5:
        pytest.skip("transformers 4.57's Mllama text config needs its rope fields given (the tiny config here is 5's)")
    torch.manual_seed(seed)
    model, inputs = BUILDERS[name](impl)
    for module in model.modules():  # training steps compare with eager: no dropout anywhere
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model, inputs


RUN_TIME_MASKS = ("mask per query row", "additive mask input")  # masks the op reads at run time (records' words)


def served(recorder: Recorder) -> list[str]:
    """Each attention layer's record as SERVED writes it."""
    out = []
    for record in recorder.records:
        if not record.rewritten:
            out.append(record.detail)
        else:
            out.append("op, run-time mask" if any(f"key_mask={m}" in record.detail for m in RUN_TIME_MASKS) else "op")
    return out


def whisper_draws_layerdrop_in_training() -> bool:
    """Whether Whisper's encoder draws its LayerDrop coin (`torch.rand([]) < layerdrop`) in every training forward,
    as transformers before ~5.2x do (later: only when layerdrop > 0): a data-dependent branch Dynamo breaks the graph
    at under any backend, so each encoder layer runs in its own graph, and the second reuses the first's code."""
    from transformers.models.whisper import modeling_whisper

    return "self.layerdrop > 0" not in inspect.getsource(modeling_whisper.WhisperEncoder.forward)


def assert_served(name: str, impl: str, recorder: Recorder, training: bool = False):
    """Each layer as SERVED says, on transformers 5. Transformers 4.57 builds some of these masks otherwise (PaliGemma's
    multiplied in place: kept, with the reason) and breaks Whisper's graph elsewhere: there the numerics alone. Where
    Whisper's LayerDrop breaks its training graph at every layer, every layer that reaches a graph is on the op."""
    if hf.transformers_major() < 5:
        return
    if name == "whisper" and training and whisper_draws_layerdrop_in_training():
        assert recorder.records and all(s.startswith("op") for s in served(recorder)), recorder.reasons
        return
    expected = SERVED[name]
    expected = expected[impl] if isinstance(expected, dict) else expected
    got = served(recorder)
    assert len(got) == len(expected), [str(r) for r in recorder.records]
    for g, e in zip(got, expected):
        assert g.startswith(e), (g, e, [str(r) for r in recorder.records])


def labels_for(name: str, inputs: dict) -> torch.Tensor:
    ids = inputs["decoder_input_ids" if name == "whisper" else "input_ids"]
    return ids.masked_fill(ids == IMAGE_TOKEN, -100)


def cases():
    """Every model in both codes; two of them in the fast tier."""
    for name in BUILDERS:
        for impl in IMPLEMENTATIONS:
            fast = (name, impl) in (("gemma3", "sdpa"), ("whisper", "sdpa"))
            yield pytest.param(name, impl, id=f"{name}-{impl}", marks=[] if fast else [pytest.mark.slow])


@pytest.mark.parametrize("name, impl", cases())
def test_forward(name, impl):
    """Inference with images (audio for Whisper): the logits eager's, each layer as SERVED says."""
    model, inputs = build(name, impl)
    model.eval()
    torch._dynamo.reset()
    recorder = Recorder()
    with torch.no_grad():
        got = torch.compile(model, backend=recorder)(**inputs).logits
        expected = model(**inputs).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert_served(name, impl, recorder)


@pytest.mark.slow
@pytest.mark.parametrize("name, impl", cases())
def test_training_step(name, impl):
    """The loss and every gradient as close to the float64 model's as eager's are (within 2x, plus 1e-5 of the
    largest value): the float32 sums of the rewritten graph are ordered otherwise, and a few gradients (Gemma 3's
    projector's) differ from eager's by more than an element-wise 1e-4. Right-padded: a left-padded row's first
    query sees no key, and eager code's float64 run turns its mask (finfo.min twice) into -inf and that row into
    NaN, which V's zero weights carry to every row."""
    model, inputs = build(name, impl)
    model.train()
    inputs = {**inputs, "labels": labels_for(name, inputs)}
    if "attention_mask" in inputs:  # padded on the right, as transformers' collators pad training batches
        inputs["attention_mask"] = inputs["attention_mask"].flip(-1)
    double = {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}
    reference = loss_and_gradients(model.double(), model, double)
    model.float()
    eager = loss_and_gradients(model, model, inputs)
    torch._dynamo.reset()
    recorder = Recorder()
    got = loss_and_gradients(torch.compile(model, backend=recorder), model, inputs)
    names = ["loss"] + [n for n, _ in model.named_parameters()]
    for key, g, e, r in zip(names, got, eager, reference):
        assert (g is None) == (e is None), key
        if g is not None:
            assert_as_close_as_eager(key, g, e, r, 1e-5)
    assert_served(name, impl, recorder, training=True)
