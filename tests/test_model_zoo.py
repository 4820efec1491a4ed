"""Real models reach `fa4::attention`: HuggingFace transformers models built from tiny configs (random
weights, `fa4_inductor.hf`), prefill and KV-cache decode, and a gpt-fast-style decoder with its KVCache.

Each test counts the `fa4::attention` calls in the compiled graphs (every attention layer), and compares
with eager in float32 (the graphs run the op's CPU reference). Padded inputs are right-padded, and
decoders are also left-padded (what `generate` does); every output row is compared, padded ones included.
"""

import pytest
import torch

import upstream
from fa4_inductor import hf
from fa4_inductor.lowering.attention import ADDITIVE_INPUT_ON_SDPA
from fa4_inductor.lowering.spellings import value
from helpers import MOE_GRAPH_BREAKS_ON_TRANSFORMERS_4, Recorder, compile_and_run, layers_reaching_graphs, tiny

DECODERS = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "phi3", "gpt_neox", "gpt2"]
ENCODERS = ["bert", "roberta", "vit", "bart"]  # bart: encoder, causal decoder, cross-attention
IMPLEMENTATIONS = ["eager", "sdpa"]
SLOW_TIER_DECODERS = ("mistral", "qwen2", "qwen3", "phi3", "gpt_neox")  # decode cases whose mask path llama, gemma2 (sliding window), gpt2 cover
SINK_DECODERS = ["gpt_oss"]  # attention sinks (and sliding layers): static-cache decode in the slow tier


def prefill_cases():
    for name in DECODERS + ENCODERS:
        for impl in IMPLEMENTATIONS:
            yield pytest.param(name, impl, None, id=f"{name}-{impl}")
            if name in ("bert", "roberta", "bart"):  # bart's padded runs in the slow tier (bert, roberta cover it)
                slow = [pytest.mark.slow] if name == "bart" else []
                yield pytest.param(name, impl, "right", id=f"{name}-{impl}-padded", marks=slow)
            elif name in DECODERS:  # decoders pad on the left (generate); right padding in the slow tier
                yield pytest.param(name, impl, "right", id=f"{name}-{impl}-padded", marks=pytest.mark.slow)
            if name in DECODERS:
                yield pytest.param(name, impl, "left", id=f"{name}-{impl}-left-padded")


def skip_where_dynamo_fails_on_transformers_4(name: str, impl: str) -> None:
    """transformers 4.57's BART and M2M-100 eager code adds a mask one key longer than its keys under torch.compile
    (any backend): skipped there."""
    if name in ("bart", "m2m_100") and impl == "eager" and hf.transformers_major() < 5:
        pytest.skip(f"transformers 4's {name} eager code adds a mask one key longer than its keys under torch.compile "
                    "(any backend)")


@pytest.mark.parametrize("name, impl, padding", prefill_cases())
def test_prefill_every_attention_layer_is_rewritten(name, impl, padding):
    """Decoders' `causal & padding` masks reach the op as its key_mask (encoders': seqused_k)."""
    skip_where_dynamo_fails_on_transformers_4(name, impl)
    model = tiny(name, impl)
    kwargs = model.inputs(padding=padding is not None)
    if padding == "left":
        kwargs["attention_mask"] = kwargs["attention_mask"].flip(-1)
    recorder, got = compile_and_run(model.forward, kwargs)
    with torch.no_grad():
        torch.testing.assert_close(got, model.forward(**kwargs), atol=1e-5, rtol=1e-5)
    if padding and kept_on_transformers_4(name, impl, recorder):
        return
    assert recorder.count() == model.attention_layers, [str(r) for r in recorder.records]
    assert all(r.rewritten for r in recorder.records), [str(r) for r in recorder.records]


KEPT_ON_TRANSFORMERS_4_PREFILL = {
    # GPT-2 masks twice (its causal buffer, then the padding mask): a row that sees no key is weighted over part of
    # the keys in eager, which the op does not reproduce
    ("gpt2", "eager"): "several masking steps",
    # GPT-J and CodeGen divide the scores by a tensor attribute (`scale_attn`), whose value the graph does not hold
    ("gptj", "eager"): "between q @ k^T and softmax is not understood",
    ("codegen", "eager"): "between q @ k^T and softmax is not understood",
    # masks 4.57 builds in ways the proofs do not read and that have no run-time form the op takes
    ("distilbert", "eager"): "built by expand_as",
    ("clip_text_model", "eager"): "updated in place",
    ("clip_text_model", "sdpa"): "of masks that are not 0 and -inf",  # causal + padding, finfo.min where hidden
    ("modernbert", "sdpa"): "not positions proven from the graph",  # its sliding layers (the global ones: the op)
    # CTRL's 4.57 code adds -1e4 where the padding mask hides a key (transformers 5: finfo.min), which does not hide it
    ("ctrl", "eager"): "has the value -10000.0",
}
"""Padded prefills whose layers transformers 4.57 writes in ways the op does not take, with their reasons: as written
(as default compile runs them), and the outputs eager's."""


def kept_on_transformers_4(name: str, impl: str, recorder: Recorder) -> bool:
    """On transformers 4.57, for the models and code of `KEPT_ON_TRANSFORMERS_4_PREFILL`: asserts that every layer
    not on the op is kept with that reason, and says True; False elsewhere."""
    reason = KEPT_ON_TRANSFORMERS_4_PREFILL.get((name, impl))
    if hf.transformers_major() >= 5 or reason is None:
        return False
    assert recorder.reasons and all(reason in r for r in recorder.reasons), recorder.reasons
    return True


MORE_DECODERS = ["gemma3_text", "cohere2", "llama4_text", "deepseek_v3", "falcon", "gptj", "gpt_bigcode", "starcoder2",
                 "olmo2", "smollm3", "gpt_oss", "opt", "codegen", "biogpt", "mixtral", "nemotron", "gemma3n_text",
                 "granite", "phi", "stablelm", "exaone4", "gemma4_text", "granite_swa",
                 "mimo_v2_flash", "gpt_neo", "ctrl"]
KEPT_DECODERS = ["mpt", "bloom"]  # ALiBi's position bias; eager code only
KEPT_WHEN_PADDED = {"gpt_neo": "several masking steps"}
"""Decoders whose padded calls keep their layers, with the reason: GPT-Neo masks its scores twice (its causal buffer,
then HF's mask), so a query row that sees no key weighs only the keys its buffer shows in eager. Unpadded calls and
training take the op (`test_call_modes.test_training_step`)."""


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", MORE_DECODERS + KEPT_DECODERS)
def test_more_decoders_left_padded(name, impl):
    """More decoders, left-padded (generate's mask), with and without a cache: sliding and global layers mixed
    (Gemma 3, Cohere 2), chunked layers (Llama 4), MLA's head dims (DeepSeek V3: q / k 24, v 16), partial rotary
    (GPT-J, Phi, StableLM), multi-query (GPT-BigCode), parallel blocks (Falcon), attention sinks and sliding layers
    (GPT-OSS: the softmax over the scores and a learned logit, the sink's column dropped before @ v), a layer reusing
    an earlier layer's K/V (Gemma 3n's KV sharing), a configured score scale (Granite's attention_multiplier), sliding
    layers with q / k norms (EXAONE 4), full layers with heads twice as wide as the sliding ones (Gemma 4), sinks
    written as the scale they put on each row (Granite SWA: out * sigmoid(logsumexp(scores) - sink)), the scores
    shifted by their row max without a sink (MiMo-V2-Flash's other layers). Every
    layer rewritten, logits eager's; ALiBi's position bias (MPT, BLOOM) is
    kept as written, each layer with its reason, logits eager's; so is GPT-Neo's padded batch (`KEPT_WHEN_PADDED`).
    CTRL: a decoder without rotary whose config names no architecture (built as a bare encoder until session 55)."""
    model = tiny(name, impl)
    kwargs = model.inputs()
    kwargs["attention_mask"] = torch.ones_like(kwargs["input_ids"])
    kwargs["attention_mask"][1, :3] = 0
    for use_cache in (True, False):
        recorder, got = compile_and_run(model.forward, {**kwargs, "use_cache": use_cache})
        with torch.no_grad():
            torch.testing.assert_close(got, model.forward(**kwargs, use_cache=use_cache), atol=1e-5, rtol=1e-5)
        if name in KEPT_DECODERS:
            assert recorder.count() == 0 and len(recorder.reasons) == model.attention_layers, recorder.reasons
        elif name in KEPT_WHEN_PADDED:
            assert recorder.count() == 0 and len(recorder.reasons) == model.attention_layers, recorder.reasons
            assert all(KEPT_WHEN_PADDED[name] in reason for reason in recorder.reasons), recorder.reasons
        elif not kept_on_transformers_4(name, impl, recorder):
            assert layers_reaching_graphs(name, model.attention_layers, recorder.count()), recorder.records
            assert all(r.rewritten for r in recorder.records), [str(r) for r in recorder.records]


MORE_ENCODERS = ["modernbert", "distilbert", "electra", "clip_text_model", "dinov2", "m2m_100", "yolos", "layoutlm"]


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", MORE_ENCODERS)
def test_more_encoders_right_padded(name, impl):
    """More encoders, right-padded: ModernBERT's sliding-window and global layers (rotary), DistilBERT, ELECTRA,
    CLIP's text tower (causal and padding), DINOv2 and YOLOS (no mask; YOLOS' config sizes images per dim), M2M-100
    (encoder, causal decoder, cross-attention), LayoutLM (BERT's extended mask built by two unsqueezes).
    Every layer rewritten, outputs eager's; ModernBERT's local layers as FA4's two-sided window (`abs(q_idx - kv_idx)
    <= w` read as a band), not a mask per query row."""
    skip_where_dynamo_fails_on_transformers_4(name, impl)
    model = tiny(name, impl)
    kwargs = model.inputs(padding=True)
    recorder, got = compile_and_run(model.forward, kwargs)
    with torch.no_grad():
        torch.testing.assert_close(got, model.forward(**kwargs), atol=1e-5, rtol=1e-5)
    if kept_on_transformers_4(name, impl, recorder):
        return
    assert recorder.count() == model.attention_layers, [str(r) for r in recorder.records]
    if name == "modernbert" and hf.transformers_major() >= 5:  # 4.57's eager code: its mask input at run time
        w = model.model.config.local_attention // 2
        assert sum(f"window_right={w}, window_left={w}" in r.detail for r in recorder.records) == 1, recorder.records


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_t5_keeps_its_position_bias_layers(impl):
    """T5's self-attention adds a learned relative position bias per head, which the op does not take: those layers
    stay as written, each with its reason; the decoder's cross-attention (no bias) takes the op; outputs eager's."""
    model = tiny("t5", impl)
    kwargs = model.inputs(padding=True)
    recorder, got = compile_and_run(model.forward, kwargs)
    layers = model.model.config.num_layers
    if impl == "eager" and hf.transformers_major() < 5:  # 4.57 adds the bias to its scores in place, returns the bias
        assert recorder.count() == 0 and all("also used outside the attention" in r for r in recorder.reasons)
        return
    assert recorder.count() == layers and len(recorder.reasons) == 2 * layers, recorder.reasons
    assert all("a learned position bias" in reason for reason in recorder.reasons), recorder.reasons
    with torch.no_grad():
        torch.testing.assert_close(got, model.forward(**kwargs), atol=1e-5, rtol=1e-5)


def generate_with_static_cache(forward, model, prompt, steps, capacity=16, attention_mask=False):
    """Logits of a prefill and of `steps` one-token decode steps through a StaticCache, and the cache.
    `attention_mask`: pass the all-ones mask over the tokens so far, as `generate` does."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=capacity)
    keyword = hf.cache_keyword(model)

    def mask(length):
        return {"attention_mask": torch.ones(prompt.shape[0], length, dtype=torch.long)} if attention_mask else {}

    logits = [forward(input_ids=prompt, **{keyword: cache}, use_cache=True, **mask(prompt.shape[1]),
                      **hf.positions(0, prompt.shape[1]))]
    for t, token in enumerate(steps.unbind(1)):
        logits.append(forward(input_ids=token[:, None], **{keyword: cache}, use_cache=True,
                              **mask(prompt.shape[1] + t + 1), **hf.positions(prompt.shape[1] + t, 1)))
    return logits, cache


KEPT_ON_TRANSFORMERS_4 = {
    # GPT-2's eager code masks twice: its causal buffer at fixed rows, then generate's mask at the cache positions
    ("gpt2", "eager"): ("combined with one at fixed positions", "several masking steps"),
}
"""Decode layers transformers 4.57 writes in ways the op does not take, with their reasons."""

ROLLED_ON_TRANSFORMERS_4 = {"gemma2", "mistral"}
"""Their sliding layers' StaticCache on 4.57 rolls the window instead of writing at the cache positions: nothing bounds
the positions to its slots, so those layers take the mask HF builds for the rolled slots as the op's key mask, and
a layer the op does not take with it is kept with `ROLLED_REASON`."""
ROLLED_REASON = "not a KV cache written"


@pytest.mark.parametrize("checked_padding", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["key-mask", "checked-padding"])  # the opt-in checked fast paths: the slow tier
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow)
                                  if name in SLOW_TIER_DECODERS + tuple(SINK_DECODERS) else name
                                  for name in DECODERS + SINK_DECODERS])
def test_static_cache_decode_every_layer_is_rewritten(name, impl, checked_padding):
    """Prefill, then decode past the sliding window (4) where there is one, with generate's all-ones
    attention mask (the op's key_mask by default; checked to hide nothing under checked_padding=True):
    two graphs, every layer rewritten."""
    model = tiny(name, impl)
    prompt, steps = torch.randint(0, 128, (2, 6)), torch.randint(0, 128, (2, 5))
    torch._dynamo.reset()
    recorder = Recorder(checked_padding=checked_padding)
    with torch.no_grad():
        compiled = torch.compile(model.forward, backend=recorder)
        got, _ = generate_with_static_cache(compiled, model.model, prompt, steps, attention_mask=True)
        expected, _ = generate_with_static_cache(model.forward, model.model, prompt, steps, attention_mask=True)
    breaks = hf.transformers_major() < 5 and name in MOE_GRAPH_BREAKS_ON_TRANSFORMERS_4
    assert breaks or len(recorder.graphs) == 2, recorder.records  # prefill and decode, each compiled once
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    kept = KEPT_ON_TRANSFORMERS_4.get((name, impl))
    if hf.transformers_major() < 5 and kept:
        assert recorder.reasons and all(any(k in r for k in kept) for r in recorder.reasons), recorder.reasons
        return
    calls = [n for g in recorder.graphs for n in recorder.calls(g)]
    decode_calls = [n for n in calls if value(n.args[0]).shape[-2] == 1]  # one query a row
    assert len(decode_calls) == model.attention_layers
    if breaks:  # the cache is written in an earlier graph: its length reaches the op as generate's mask, no seqused_k
        assert all(n.args[3] is None and n.args[4] is not None for n in decode_calls)
        assert len(calls) == 2 * model.attention_layers and not recorder.reasons, recorder.reasons
        return
    if hf.transformers_major() < 5 and name in ROLLED_ON_TRANSFORMERS_4:  # the rolled layers: a key mask, no seqused_k
        assert any(n.args[3] is None for n in decode_calls)
        assert all(n.args[3] is not None or n.args[4] is not None for n in decode_calls)
        # but Gemma 2's sliding prefill in eager code: its mask, read at run time, goes to SDPA, which has no softcap
        assert all(ROLLED_REASON in r for r in recorder.reasons), recorder.reasons
        assert recorder.count() + len(recorder.reasons) == 2 * model.attention_layers, recorder.records
        return
    assert all(n.args[3] is not None for n in decode_calls)  # seqused_k: the cache length
    assert all((len(n.args) > 4) != checked_padding for n in decode_calls)  # key_mask: generate's mask
    assert recorder.count() == 2 * model.attention_layers and not recorder.reasons, recorder.reasons


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_generate_with_a_static_cache_decodes_through_the_op(name):
    """`generate(cache_implementation="static")` compiles the decode step itself, with a boolean
    [B, 1, 1, Sk] mask as a graph input: read as the op's key_mask. A left-padded batch generates the
    same tokens and scores as without compiling."""
    from transformers import CompileConfig

    model = tiny(name, "sdpa").model
    ids = torch.randint(1, 128, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding, as generate wants it
    recorder = Recorder()
    config = CompileConfig(backend=recorder, fullgraph=True)
    config._compile_all_devices = True  # HF compiles on GPUs only by default
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, cache_implementation="static",
                  pad_token_id=0, return_dict_in_generate=True, output_scores=True)
    torch._dynamo.reset()
    with torch.no_grad():
        model.generation_config.compile_config = config
        got = model.generate(ids, **kwargs)
        model.generation_config.compile_config = None
        if hf.transformers_major() < 5:
            del model._cache  # transformers 4.57 fails to reuse a static cache of an earlier generate call
        expected = model.generate(ids, disable_compile=True, **kwargs)
    assert recorder.graphs and recorder.count() == len(recorder.graphs) * model.config.num_hidden_layers
    assert all("key_mask" in r.detail for r in recorder.records), recorder.records
    assert torch.equal(got.sequences, expected.sequences)
    for g, e in zip(got.scores, expected.scores):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["llama", *(pytest.param(name, marks=pytest.mark.slow)
                                              for name in ("qwen3", "qwen2", "mistral", "phi3", "gpt_neox", "gpt2",
                                                           "gemma2"))])
def test_generate_with_a_static_cache_in_eager_code_takes_its_mask_input_to_the_op(name):
    """Eager attention code under `generate(cache_implementation="static")`: the prefill and every decode step get
    generate's float mask as a graph input ([B, 1, Sq, Sk], [B, 1, 1, Sk]: 0 / finfo.min, but nothing in the graph
    says so). Each layer goes to the op with the mask as its additive key_mask and K/V un-repeated, not eager's
    matmuls and softmax; but Gemma-2's prefill, kept as written with the reason (a softcap: the op would run the
    reference where FA4 does not take the mask). A left-padded batch generates the same tokens and scores as
    without compiling."""
    model = tiny(name, "eager").model
    recorder = eager_code_static_generate(model, Recorder())
    layers = model.config.num_hidden_layers
    if name == "gpt2" and hf.transformers_major() < 5:  # 4.57's GPT-2 masks twice: its causal buffer, then the input
        assert recorder.count() == 0 and all("values are unknown when compiling" in r for r in recorder.reasons)
        return
    on_op = recorder.records[layers:] if name == "gemma2" else recorder.records
    config = model.config
    grouped = getattr(config, "num_key_value_heads", None) not in (None, config.num_attention_heads)
    assert all("key_mask=additive mask input" in r.detail and ("folded" in r.detail) == grouped for r in on_op), on_op
    assert recorder.count() == len(on_op)
    if name == "gemma2":
        assert all("the mask is the graph input" in r and "softcap" in r for r in recorder.reasons) and \
            len(recorder.reasons) == layers, recorder.records


def assert_generates_as_eager(model, ids, recorder: Recorder, **kwargs) -> None:
    """Greedy `model.generate(ids, **kwargs)` over its forward compiled with `recorder` (a fresh Dynamo): the same
    tokens and scores as uncompiled."""
    kwargs = dict(do_sample=False, return_dict_in_generate=True, output_scores=True, **kwargs)
    forward = model.forward
    torch._dynamo.reset()
    with torch.no_grad():
        expected = model.generate(ids, **kwargs)
        # transformers 4.57 keeps the static cache for the next call and, for models whose cache layers are not all
        # written (Qwen 3, Gemma 2), fails to reuse it (StaticLayer.max_batch_size), compiled or not
        model.__dict__.pop("_cache", None)
        model.forward = torch.compile(forward, backend=recorder)
        try:
            got = model.generate(ids, **kwargs)
        finally:
            model.forward = forward
    assert torch.equal(got.sequences, expected.sequences)
    for g, e in zip(got.scores, expected.scores):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


def eager_code_static_generate(model, recorder: Recorder) -> Recorder:
    """A left-padded batch of 2 through `generate(cache_implementation="static")` over `model.forward` compiled with
    `recorder`: the same tokens and scores as uncompiled, two graphs (the prefill, one decode step for every step)
    and a record per layer of each."""
    ids = torch.randint(1, 100, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    assert_generates_as_eager(model, ids, recorder, attention_mask=mask, max_new_tokens=5,
                              cache_implementation="static", pad_token_id=0)
    assert len(recorder.graphs) == 2 and len(recorder.records) == 2 * model.config.num_hidden_layers
    return recorder


def test_eager_code_generate_passes_its_mask_input_to_sdpa_with_the_option_off():
    """`backend(additive_masks_on_op=False)`: each layer of generate's prefill and decode steps becomes the SDPA call
    with the mask (floored, lowering/crossover.py) as given, which computes what eager does for any values."""
    model = tiny("llama", "eager").model
    recorder = eager_code_static_generate(model, Recorder(additive_masks_on_op=False))
    assert all(r.rewritten and r.detail.endswith(ADDITIVE_INPUT_ON_SDPA) for r in recorder.records), recorder.records


def test_generate_compiling_its_decode_step_with_a_configured_backend_compiles_once():
    """HF's generate deep-copies its `CompileConfig(backend=fa4_inductor.backend(...))` on every call: the second
    generate reuses the first one's compiled decode step (a copied backend was a new callable to Dynamo, which
    recompiled the step every generate: 90 against 1198 tokens/s on the H200)."""
    from transformers import CompileConfig

    model = tiny("llama", "eager").model
    ids = torch.randint(1, 100, (2, 7), generator=torch.Generator().manual_seed(3))
    recorder = Recorder()
    config = CompileConfig(backend=recorder)
    config._compile_all_devices = True  # HF compiles on GPUs only by default
    kwargs = dict(max_new_tokens=3, do_sample=False, cache_implementation="static", pad_token_id=0)
    torch._dynamo.reset()
    model.generation_config.compile_config = config
    try:
        with torch.no_grad():
            model.generate(ids, **kwargs)
            compiled = len(recorder.graphs)
            model.generate(ids, **kwargs)
    finally:
        model.generation_config.compile_config = None
    assert compiled >= 1 and len(recorder.graphs) == compiled, len(recorder.graphs)


@pytest.mark.slow
@pytest.mark.parametrize("attention_mask, checked", [(False, False), (True, False), (True, True)],
                         ids=["no-mask", "generate-mask-as-key-mask", "generate-mask-checked"])
def test_static_cache_decode_with_inductor_writes_the_cache_in_place(attention_mask, checked):
    """Compiled by Inductor (key masks and run-time checks included): decode logits and the cache contents
    match eager."""
    model = tiny("llama", "sdpa")
    prompt, steps = torch.randint(0, 128, (2, 5)), torch.randint(0, 128, (2, 3))
    torch._dynamo.reset()
    recorder = Recorder(inductor=True, checked_padding=checked)
    with torch.no_grad():
        compiled = torch.compile(model.forward, backend=recorder)
        got, cache = generate_with_static_cache(compiled, model.model, prompt, steps, attention_mask=attention_mask)
        expected, expected_cache = generate_with_static_cache(model.forward, model.model, prompt, steps,
                                                              attention_mask=attention_mask)
    assert recorder.count() == 2 * model.attention_layers
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    for layer, expected_layer in zip(cache.layers, expected_cache.layers):
        torch.testing.assert_close(layer.keys, expected_layer.keys)
        torch.testing.assert_close(layer.values, expected_layer.values)


@pytest.mark.parametrize("name, impl", [("bert", "sdpa"), ("llama", "eager"), ("llama", "sdpa")])
def test_padding_with_inductor_matches_eager(name, impl):
    """Left-padded (decoders) or right-padded (encoders) batches as key masks, compiled by Inductor; the
    eager decoder's rows that see no key take the mean of V in the graph."""
    model = tiny(name, impl)
    kwargs = model.inputs(padding=True)
    if model.kind == "causal-lm":
        kwargs["attention_mask"] = kwargs["attention_mask"].flip(-1)
    recorder, got = compile_and_run(model.forward, kwargs, inductor=True)
    assert recorder.count() == model.attention_layers
    with torch.no_grad():
        torch.testing.assert_close(got, model.forward(**kwargs), atol=1e-5, rtol=1e-5)


def test_encoder_left_padding_matches_eager_or_is_stopped_under_checked_padding():
    """By default a left-padded encoder batch runs exactly (key_mask); a graph compiled with
    `checked_padding=True` for right padding never silently runs a left-padded mask."""
    model = tiny("bert", "eager")
    kwargs = model.inputs(padding=True)
    left = {**kwargs, "attention_mask": kwargs["attention_mask"].flip(-1)}
    recorder, got = compile_and_run(model.forward, left)
    assert recorder.count() == model.attention_layers
    with torch.no_grad():
        torch.testing.assert_close(got, model.forward(**left), atol=1e-5, rtol=1e-5)
    compiled_recorder, _ = compile_and_run(model.forward, kwargs, checked_padding=True)
    assert compiled_recorder.count() == model.attention_layers
    compiled = torch.compile(model.forward, backend=compiled_recorder)
    kwargs["attention_mask"] = kwargs["attention_mask"].flip(-1)
    with torch.no_grad(), pytest.raises(RuntimeError, match="not right padding"):
        compiled(**kwargs)


def test_padding_option_off_keeps_padding_masks():
    model = tiny("bert", "sdpa")
    recorder, _ = compile_and_run(model.forward, model.inputs(padding=True), padding=False)
    assert recorder.count() == 0
    assert set(recorder.reasons) == {"a run-time key-padding mask, and the padding option is off"}


def test_decoder_padded_batch_is_stopped_by_the_run_time_check_under_checked_padding():
    """`backend(checked_padding=True)`: FA4's fast path for causal + padding, exact only when the mask hides
    no key the causal band shows, checked at run time."""
    model = tiny("qwen2", "sdpa")
    kwargs = model.inputs(padding=True)
    unpadded = {**kwargs, "attention_mask": torch.ones_like(kwargs["attention_mask"])}
    recorder, _ = compile_and_run(model.forward, unpadded, checked_padding=True)
    assert recorder.count() == model.attention_layers
    with torch.no_grad(), pytest.raises(RuntimeError, match="hides keys that the causal mask shows"):
        torch.compile(model.forward, backend=recorder)(**kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_no_recompile_across_batch_and_sequence_length(name):
    """After the first dynamic compile (torch.compile's automatic dynamic shapes: the second shape seen),
    new batch sizes, prompt lengths and cache positions reuse the prefill and the decode graph."""
    model = tiny(name, "sdpa")
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(model.forward, backend=recorder)
    compiled_graphs = []
    with torch.no_grad():
        for batch, length in ((2, 6), (3, 9), (4, 7), (5, 11)):  # batch 1 is specialized, as always
            prompt, steps = torch.randint(0, 128, (batch, length)), torch.randint(0, 128, (batch, 3))
            got, _ = generate_with_static_cache(compiled, model.model, prompt, steps)
            expected, _ = generate_with_static_cache(model.forward, model.model, prompt, steps)
            for g, e in zip(got, expected):
                torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
            compiled_graphs.append(len(recorder.graphs))
    assert compiled_graphs == [2, 4, 4, 4]  # static prefill + decode, then dynamic prefill + decode
    assert recorder.count() == 4 * model.attention_layers and not recorder.reasons, recorder.reasons


def gpt_fast_generate(model, prompt, steps):
    """Outputs of a prefill at positions 0..P-1 and of one-token steps after it."""
    p = prompt.shape[1]
    outs = [model(prompt, torch.arange(p))]
    for t, x in enumerate(steps.unbind(1)):
        outs.append(model(x[:, None], torch.tensor([p + t])))
    return outs


@pytest.mark.parametrize("inductor", [False, True], ids=["rewrite", "inductor"])
def test_gpt_fast_kv_cache_prefill_and_decode(inductor):
    torch.manual_seed(0)
    model, reference = upstream.GptFastDecoder(), upstream.GptFastDecoder()
    reference.load_state_dict(model.state_dict())
    prompt, steps = torch.randn(2, 7, 64), torch.randn(2, 4, 64)
    torch._dynamo.reset()
    recorder = Recorder(inductor=inductor)
    with torch.no_grad():
        got = gpt_fast_generate(torch.compile(model, backend=recorder), prompt, steps)
        expected = gpt_fast_generate(reference, prompt, steps)
    assert len(recorder.graphs) == 2  # prefill and decode
    assert recorder.count() == 4 and not recorder.reasons, recorder.reasons
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    for layer, ref in zip(model.layers, reference.layers):
        torch.testing.assert_close(layer.kv_cache.k_cache, ref.kv_cache.k_cache, atol=1e-6, rtol=1e-6)


def test_gpt_fast_non_consecutive_positions_are_stopped_by_the_run_time_check():
    model = upstream.GptFastDecoder()
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(model, backend=recorder)
    with torch.no_grad():
        compiled(torch.randn(2, 4, 64), torch.arange(4))
        with pytest.raises(RuntimeError, match="do not count up by one"):
            compiled(torch.randn(2, 4, 64), torch.tensor([0, 1, 3, 4]))


@pytest.mark.slow
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_explain_by_model_type(capsys, impl):
    """Prefill, decode, then a left-padded prefill: by then automatic dynamic shapes have made the key
    length symbolic while the new mask's length is not (the padding mask is read under a guard); then a
    forward without a cache."""
    from fa4_inductor.__main__ import main

    pytest.importorskip("transformers")
    torch._dynamo.reset()
    assert main(["explain", "hf:qwen2", "--attn", impl]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"qwen2 ({impl}): Qwen2ForCausalLM, 2 attention layers per forward"
    for phase in ("prefill", "decode", "prefill, left-padded", "forward, use_cache=False"):
        assert f"{phase}: 2/2 attention layers rewritten" in lines, lines
    family = "sdpa       " if impl == "sdpa" else "handwritten"
    assert sum(f"[rewritten] {family} model.model.layers.1.self_attn" in line for line in lines) == 4
    assert sum("key_mask=padding mask" in line for line in lines) == 2


@pytest.mark.slow
def test_explain_takes_eager_code_where_a_model_has_no_sdpa_code(capsys):
    """MPNet has eager code only: `explain` uses it unless sdpa is asked for, which it refuses with the reason. Its
    relative position bias (a learned table) is named as the reason its layers stay as written."""
    from fa4_inductor.__main__ import main

    torch._dynamo.reset()
    assert main(["explain", "hf:mpnet"]) == 2  # not every layer rewritten
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "mpnet (eager): MPNetModel, 2 attention layers per forward"
    assert sum("a learned position bias" in line for line in lines) == 4, lines
    assert main(["explain", "hf:mpnet", "--attn", "sdpa"]) == 2
    assert "has no sdpa attention" in capsys.readouterr().out


def tiny_that_runs(name: str) -> hf.Tiny:
    """`tiny(name, "sdpa")` (skipped where this transformers has no such model type), its forward finite."""
    model = tiny(name, "sdpa")
    with torch.no_grad():
        assert torch.isfinite(model.forward(**model.inputs())).all()
    return model


@pytest.mark.parametrize("name, attention_layers", [("ministral", 2), ("hunyuan_v1_dense", 2), ("dots1", 2),
                                                     ("qwen3_next", 1), ("gemma3n_text", 2), ("gemma4_text", 2)])
def test_tiny_configs_transformers_cannot_build_as_they_come(name, attention_layers):
    """Default configs that do not build at the tiny size as they come: a head_dim left None (Ministral, Hunyuan), an
    expert count left None (dots.llm1), a hybrid whose first layers are all linear attention (Qwen3-Next: its tiny
    layers are one linear and one full attention layer, and only the full one counts as attention), per-layer lists
    sized for 35 layers (Gemma 3n), attributes set per layer (Gemma 4: its full layers' heads 32 wide, its sliding
    ones' 16)."""
    model = tiny_that_runs(name)
    assert model.attention_layers == attention_layers
    if name == "gemma4_text":
        widths = [m.head_dim for n, m in model.model.named_modules() if n.endswith("self_attn")]
        assert widths == [16, 32] and model.model.config.layer_types == ["sliding_attention", "full_attention"]


def test_explain_says_when_a_tiny_model_cannot_be_built(capsys, monkeypatch):
    """A default config transformers itself cannot build (DBRX's in 5.25 lacks a field its attention reads): one line
    that says so and what to give instead, exit status 2, no traceback."""
    from fa4_inductor.__main__ import main

    def fails(name, attn_implementation):
        raise AttributeError("'DbrxAttentionConfig' object has no attribute 'rope_theta'")

    monkeypatch.setattr(hf, "build", fails)
    assert main(["explain", "hf:llama"]) == 2
    assert capsys.readouterr().out == (
        "llama: a tiny model could not be built from its default config (AttributeError: 'DbrxAttentionConfig' "
        "object has no attribute 'rope_theta'); give the path of a checkpoint's config.json instead "
        "(hf:/path/to/checkpoint)\n")


@pytest.mark.parametrize("name, built", [("gemma3", "Gemma3ForCausalLM"), ("paligemma", "GemmaForCausalLM"),
                                         ("llava", "LlamaForCausalLM"), ("qwen2_vl", "Qwen2VLTextModel")])
def test_multimodal_model_types_build_their_language_model(name, built):
    """`hf.build` of a multimodal type builds its language model, tiny (its composite default config keeps the vision
    tower, and a text config left full size, at their real sizes: `explain hf:qwen2_vl` ran out of memory building a 7B
    model), with Qwen2-VL's M-RoPE sections sized for the tiny head; `explain` says it is the language model."""
    tiny = tiny_that_runs(name)
    assert type(tiny.model).__name__ == built and tiny.language_model_of == name
    assert sum(p.numel() for p in tiny.model.parameters()) < 200_000


@pytest.mark.slow  # 15 s: three multimodal models explained (the fast tier's explain tests cover the command)
def test_explain_says_what_it_explains_of_a_multimodal_model_and_when_token_ids_are_not_enough(capsys):
    """`explain hf:gemma3`: the language model, said so on the first line. `explain hf:whisper`: log-mel features in
    place of token ids, the decoder's tokens padded, every layer rewritten. `explain hf:speech_to_text`: its forward
    wants features of another shape, so one line says so and what to give instead, exit status 2, no traceback."""
    pytest.importorskip("transformers")
    from fa4_inductor.__main__ import main

    torch._dynamo.reset()
    assert main(["explain", "hf:gemma3"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == ("gemma3 (sdpa): Gemma3ForCausalLM (its language model: token "
                                                       "ids reach no other tower), 2 attention layers per forward")
    torch._dynamo.reset()
    assert main(["explain", "hf:whisper"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "whisper (sdpa): WhisperModel, 6 attention layers per forward"
    assert "forward, right-padded: 6/6 attention layers rewritten" in lines
    torch._dynamo.reset()
    assert main(["explain", "hf:speech_to_text"]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("speech_to_text: its forward could not run on token ids alone (") and \
        lines[1].endswith("explain it with a MODULE:FUNCTION that returns the model and its inputs") and len(lines) == 2


@pytest.mark.parametrize("padded", [pytest.param(False, marks=pytest.mark.slow), True], ids=["unpadded", "left-padded"])
def test_generate_with_static_cache_and_a_compiled_forward_is_rewritten(padded):
    """`generate(cache_implementation="static")` with the whole forward compiled: the decode steps' masks
    arrive as boolean [B, 1, 1, Sk] graph inputs, read as key masks; a padded batch's prefill mask as a boolean
    [B, 1, Sq, Sk] one (transformers 5.24 builds it outside the forward), read as the op's [B, Sq, Sk] key mask;
    every layer is rewritten, and the tokens are uncompiled generate's."""
    model = tiny("llama", "sdpa").model
    model.generation_config.pad_token_id = 0
    prompt = torch.randint(3, 128, (2, 6))
    mask = torch.ones_like(prompt)
    if padded:
        mask[1, :2] = 0
    kwargs = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, cache_implementation="static")
    forward = model.forward
    with torch.no_grad():
        expected = model.generate(prompt, **kwargs)
        torch._dynamo.reset()
        recorder = Recorder()
        model.forward = torch.compile(forward, backend=recorder)
        got = model.generate(prompt, **kwargs)
    model.forward = forward
    assert torch.equal(got, expected)
    assert not recorder.reasons and recorder.count() == 2 * model.config.num_hidden_layers, recorder.reasons
    prefill = [r.detail for r in recorder.records if "q[2x4x6x" in r.detail]
    assert len(prefill) == model.config.num_hidden_layers
    # transformers 5.24 hands the padded prefill a [B, 1, Sq, Sk] mask ("mask per query row"), 5.17 a [B, Sk] one;
    # 4.57 builds the prefill's [B, 1, Sq, Sk] mask outside the forward, padded or not
    assert all(("key_mask=" in d) == (padded or hf.transformers_major() < 5) for d in prefill), prefill


@pytest.mark.parametrize("impl", [impl if impl == "eager" else pytest.param(impl, marks=pytest.mark.slow)
                                  for impl in IMPLEMENTATIONS])
def test_dynamic_true_compiles_once(impl):
    """`dynamic=True` makes HF's float `scaling` attribute symbolic: it is specialized (guarded), not declined."""
    model = tiny("llama", impl)
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(model.forward, backend=recorder, dynamic=True)
    with torch.no_grad():
        for batch, seq in ((2, 8), (3, 11), (4, 5)):
            kwargs = model.inputs(batch=batch, seq=seq)
            torch.testing.assert_close(compiled(**kwargs), model.forward(**kwargs), atol=1e-5, rtol=1e-5)
    assert len(recorder.graphs) == 1 and recorder.count() == model.attention_layers and not recorder.reasons


def test_explain_by_local_checkpoint_path(tmp_path, capsys):
    """A local checkpoint directory: its config.json, shrunk like a model type's default config."""
    from fa4_inductor.__main__ import main

    transformers = pytest.importorskip("transformers")
    transformers.AutoConfig.for_model("bert").save_pretrained(tmp_path)
    torch._dynamo.reset()
    assert main(["explain", str(tmp_path), "--attn", "eager"]) == 0
    out = capsys.readouterr().out
    assert "forward, right-padded: 2/2 attention layers rewritten" in out
    assert "key_mask=padding mask" in out


@pytest.mark.parametrize("name, builds", [("llama", True), ("Qwen/Qwen3-0.6B", True), ("qwen9", False),
                                          ("Qwen/Qwen3/0.6B", False), ("/tmp", True)])
def test_explain_reads_a_bare_model_type_or_hub_id_as_transformers(name, builds):
    """`explain llama` as `explain hf:llama`; owner/name is a Hub id; an existing path is a checkpoint (its loading
    says what is wrong with it); anything else is refused with what MODEL may be."""
    from fa4_inductor.__main__ import transformers_name_reason

    pytest.importorskip("transformers")
    reason = transformers_name_reason(name)
    assert (reason is None) == builds, reason


def test_explain_refuses_a_name_it_cannot_read(capsys):
    from fa4_inductor.__main__ import main

    pytest.importorskip("transformers")
    assert main(["explain", "qwen9"]) == 2
    out = capsys.readouterr().out
    assert out.startswith("qwen9: not a transformers model type") and "Hub id" in out, out


@pytest.mark.slow
def test_explain_by_hub_id(capsys, monkeypatch):
    """A Hub id: only its config.json is read (here handed over as BERT's default config, no network)."""
    from fa4_inductor.__main__ import main

    transformers = pytest.importorskip("transformers")
    asked = []

    def from_pretrained(name, *args, **kwargs):
        asked.append(name)
        return transformers.AutoConfig.for_model("bert")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", from_pretrained)
    torch._dynamo.reset()
    assert main(["explain", "google-bert/bert-base-uncased", "--attn", "eager"]) == 0
    assert set(asked) == {"google-bert/bert-base-uncased"}
    out = capsys.readouterr().out
    assert out.startswith("google-bert/bert-base-uncased (eager): BertModel, 2 attention layers per forward"), out
    assert "forward, right-padded: 2/2 attention layers rewritten" in out


def test_gpt_fast_no_recompile_across_prompt_lengths():
    """Prefill recompiles once (automatic dynamic shapes), decode never: the position check is symbolic."""
    torch.manual_seed(0)
    model, reference = upstream.GptFastDecoder(), upstream.GptFastDecoder()
    reference.load_state_dict(model.state_dict())
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(model, backend=recorder)
    graphs = []
    with torch.no_grad():
        for length in (5, 7, 9, 6):
            prompt, steps = torch.randn(2, length, 64), torch.randn(2, 3, 64)
            for g, e in zip(gpt_fast_generate(compiled, prompt, steps), gpt_fast_generate(reference, prompt, steps)):
                torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
            graphs.append(len(recorder.graphs))
    assert graphs == [2, 3, 3, 3]  # static prefill + decode, then one dynamic prefill
    assert recorder.count() == 6 and not recorder.reasons


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_training_with_a_left_padded_batch_matches_eager(impl):
    """Fine-tuning on a left-padded batch: the key-mask op's backward gives eager's gradients. With eager code's
    finfo.min mask a padded row sees no key, and eager's softmax still passes it a gradient (the last padded
    position predicts the first real token), which `blind_rows_as_eagers` gives too."""
    model = tiny("llama", impl)
    kwargs = model.inputs(padding=True)
    kwargs["attention_mask"] = kwargs["attention_mask"].flip(-1)
    labels = kwargs["input_ids"].masked_fill(kwargs["attention_mask"] == 0, -100)
    torch._dynamo.reset()
    recorder = Recorder(inductor=True)
    compiled = torch.compile(model.model, backend=recorder)
    grads = []
    for fn in (compiled, model.model):
        model.model.zero_grad()
        fn(**kwargs, labels=labels).loss.backward()
        grads.append([p.grad.clone() for p in model.model.parameters()])
    assert recorder.count() == model.attention_layers, recorder.reasons
    for got, expected in zip(*grads):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_gpt_neo_decodes_on_the_op_past_its_window():
    """GPT-Neo masks with its causal buffer sliced at the last queries' rows, `bias[:, :, Sk - Sq:Sk, :Sk]` (its
    windowed layers' buffer a band): in a decode step under dynamic shapes those rows start at a symbolic size, read
    as the buffer's band at query positions Sk - Sq + i. Greedy `generate` over a compiled forward, past the window
    (4 here): eager's tokens and logits, every layer of every graph on the op, the windowed ones with their window."""
    transformers = pytest.importorskip("transformers")
    config = hf.tiny_config("gpt_neo", "eager")
    config.window_size = 4
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    model.generation_config.pad_token_id = 0
    ids = torch.randint(3, 100, (1, 7), generator=torch.Generator().manual_seed(1))
    recorder = Recorder()
    assert_generates_as_eager(model, ids, recorder, max_new_tokens=6)
    if hf.transformers_major() < 5:  # 4.57 also masks at the cache positions (a run-time tensor beside the buffer's
        # rows; its mask updated in place): decode steps stay as written, as GPT-2's eager code there
        # (`KEPT_ON_TRANSFORMERS_4`)
        assert recorder.reasons and all(r.startswith("mask not recognized") for r in recorder.reasons), recorder.reasons
        return
    assert not recorder.reasons and recorder.count() == 2 * len(recorder.graphs) >= 6, recorder.records
    assert sum("window_left=3" in r.detail for r in recorder.records) == len(recorder.graphs), recorder.records
