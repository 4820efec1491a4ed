"""HF decoders reach `fa4::attention` in every way training, evaluation and generation call them: with
`use_cache=False` (training scripts, eval loops, embedding code) or True, with or without `position_ids`,
with no `attention_mask` or one that is all ones, left- or right-padded or holed, in a training step with
labels, and over growing sequence lengths (automatic dynamic shapes) or under `dynamic=True`.

HF builds a different mask in each mode (transformers' `masking_utils`), and masks.py proves each one:

    use_cache=False, no attention_mask   causal (or sliding window) on positions read back from the in-graph
                                         position table `position_ids[b, q_idx]`, and HF's packed-sequence
                                         ids of those positions (`cumsum(diff(position_ids) != 1)`), constant
    with an attention_mask               the band on `arange` positions, and the mask as a key mask
    use_cache=True                       the band at the cache's offset (a SymInt once lengths are dynamic)

Each test counts the op's calls (every attention layer of every compiled graph) and compares with eager
in float32 (the rewritten graph runs eagerly: the op's CPU reference); the training tests also compare
the loss and every parameter's gradient. Llama, Qwen3, Mistral (sliding window) and Gemma2 (softcap,
sliding and full layers) are the main families; Qwen2, Phi-3, GPT-NeoX and GPT-2 take a training step.
Every family and code runs each mode in the survey this module was written from, but compiling costs
seconds per case, so each mode covers a few: the cases marked `slow` add more (`-m "not gpu and not
slow"` skips them while iterating).
"""

import inspect

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import upstream
from fa4_inductor import hf
from fa4_inductor.kernels import attention as attention_op, reference
from helpers import (CROSSOVER_ROUTES, Recorder, assert_as_close_as_eager, compile_and_run, layers_reaching_graphs,
                     tiny)

FAMILIES = ["llama", "qwen3", "mistral", "gemma2"]  # gemma2: softcap, sliding and full layers; eager code only
IMPLEMENTATIONS = ["eager", "sdpa"]
SHORT_LIST = [("llama", "eager"), ("llama", "sdpa"), ("mistral", "eager"), ("gemma2", "eager")]  # not slow
PADDING = ["ones", "left", "right", "holes"]


def case(*values, slow=False):
    """A test case named by its values (`llama-sdpa-...`), under the slow marker if `slow`."""
    name = "-".join(str(v) for v in values if v is not None)
    return pytest.param(*values, id=name, marks=[pytest.mark.slow] if slow else [])


def padding_mask(kind: str, batch: int, seq: int) -> torch.Tensor:
    """An attention_mask: all ones, row 1 left- or right-padded by 3, or holes in both rows."""
    mask = torch.ones(batch, seq, dtype=torch.long)
    if kind == "left":
        mask[1, :3] = 0
    elif kind == "right":
        mask[1, -3:] = 0
    elif kind == "holes":
        mask[0, 2] = 0
        mask[1, 4:6] = 0
    return mask


def layers_served(recorder: Recorder) -> int:
    """Attention layers on the op, or where lowering's crossover applies (CUDA; test_call_modes_crossover.py) made
    into an SDPA call or kept as the model makes it."""
    return recorder.count() + sum(r.detail.startswith(CROSSOVER_ROUTES) for r in recorder.records)


def other_reasons(recorder: Recorder) -> list[str]:
    return [r for r in recorder.reasons if not r.startswith(CROSSOVER_ROUTES)]


def assert_every_layer_rewritten(recorder: Recorder, model, graphs: int | None = 1, name: str = ""):
    """Every attention layer of each of `graphs` compiled graphs (None: any number of graphs, the layers split
    between them by graph breaks; those of `name` reaching them, `layers_reaching_graphs`) is served
    (`layers_served`), and no layer is kept for another reason."""
    if graphs is not None:
        assert len(recorder.graphs) == graphs, [str(r) for r in recorder.records]
        assert layers_served(recorder) == graphs * model.attention_layers, [str(r) for r in recorder.records]
    else:
        assert layers_reaching_graphs(name, model.attention_layers, layers_served(recorder)), recorder.records
    assert not other_reasons(recorder), recorder.reasons


def assert_matches_eager(compiled, model, kwargs):
    with torch.no_grad():
        torch.testing.assert_close(compiled(**kwargs), model.forward(**kwargs), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name, impl", [case(name, impl, slow=(name, impl) not in SHORT_LIST)
                                        for name in FAMILIES for impl in IMPLEMENTATIONS])
def test_without_cache(name, impl):
    """`use_cache=False` without an attention_mask: the positions come back through HF's position table."""
    model = tiny(name, impl)
    kwargs = {**model.inputs(), "use_cache": False}
    recorder, got = compile_and_run(model.forward, kwargs)
    assert_every_layer_rewritten(recorder, model)
    with torch.no_grad():
        torch.testing.assert_close(got, model.forward(**kwargs), atol=1e-5, rtol=1e-5)


# With a cache, test_model_zoo's prefill tests cover left and right padding in every family.
PADDED_CALLS = [case("llama", "eager", "no-cache"), case("llama", "sdpa", "no-cache"),
                case("mistral", "sdpa", "no-cache"), case("llama", "eager", "cache"),
                case("gemma2", "eager", "no-cache", slow=True),
                case("qwen3", "sdpa", "no-cache", slow=True), case("mistral", "eager", "no-cache", slow=True)]


@pytest.mark.parametrize("name, impl, cache", PADDED_CALLS)
def test_padding_masks(name, impl, cache):
    """One graph for every attention_mask (all ones, left, right, holes): the band, and the mask as a key mask."""
    model = tiny(name, impl)
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(model.forward, backend=recorder)
    for kind in PADDING:
        kwargs = model.inputs()
        kwargs.update(attention_mask=padding_mask(kind, 2, kwargs["input_ids"].shape[1]), use_cache=cache == "cache")
        assert_matches_eager(compiled, model, kwargs)
    assert_every_layer_rewritten(recorder, model)


OTHER_CALL_FORMS = {
    # embeddings passed in place of ids (prompt tuning, multimodal front ends): HF builds the mask from their shape
    "inputs_embeds": lambda model, ids, mask: model(inputs_embeds=model.get_input_embeddings()(ids),
                                                   attention_mask=mask).logits,
    # every layer's hidden states and a tuple output (feature extraction, older training loops)
    "hidden states, tuple": lambda model, ids, mask: torch.stack(model(ids, attention_mask=mask,
                                                                       output_hidden_states=True,
                                                                       return_dict=False)[-1]),
}


@pytest.mark.parametrize("form", sorted(OTHER_CALL_FORMS))
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_other_call_forms_on_a_left_padded_batch(form, impl):
    """A left-padded batch called with embeddings for ids, or asking for every hidden state as a tuple (Dynamo breaks
    that graph where transformers collects them, default compile too): every layer on the op, the outputs eager's."""
    model = tiny("llama", impl)
    ids = model.inputs()["input_ids"]
    mask = padding_mask("left", *ids.shape)
    call = OTHER_CALL_FORMS[form]
    recorder, got = compile_and_run(lambda ids, mask: call(model.model, ids, mask), {"ids": ids, "mask": mask})
    assert_every_layer_rewritten(recorder, model, graphs=1 if form == "inputs_embeds" else None, name="llama")
    with torch.no_grad():
        torch.testing.assert_close(got, call(model.model, ids, mask), atol=1e-5, rtol=1e-5)


POSITION_MODES = {
    "no-cache-with-mask": dict(use_cache=False, attention_mask="ones"),
    "no-cache-left-padded": dict(use_cache=False, attention_mask="left"),
    "cache": dict(use_cache=True),
    "cache-holes": dict(use_cache=True, attention_mask="holes"),
}
POSITION_CALLS = [case("llama", "sdpa", "no-cache-left-padded"), case("llama", "sdpa", "cache"),
                  case("gemma2", "eager", "cache-holes"), case("llama", "sdpa", "no-cache-with-mask", slow=True),
                  case("llama", "eager", "cache-holes", slow=True)]


@pytest.mark.parametrize("name, impl, mode", POSITION_CALLS)
def test_position_ids(name, impl, mode):
    """Explicit position_ids (counting from 1 in row 1: any values) are not what the mask is built from
    when there is a cache or an attention_mask."""
    model = tiny(name, impl)
    kwargs = model.inputs()
    seq = kwargs["input_ids"].shape[1]
    options = dict(POSITION_MODES[mode])
    if "attention_mask" in options:
        options["attention_mask"] = padding_mask(options["attention_mask"], 2, seq)
    kwargs.update(options, position_ids=torch.stack([torch.arange(seq), torch.arange(1, seq + 1)]))
    recorder, got = compile_and_run(model.forward, kwargs)
    assert_every_layer_rewritten(recorder, model)
    with torch.no_grad():
        torch.testing.assert_close(got, model.forward(**kwargs), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["sdpa", pytest.param("eager", marks=pytest.mark.slow)])
def test_position_ids_without_cache_or_mask_stay_as_written_without_run_time_masks(impl):
    """Without a cache or an attention_mask, HF reads packed sequences from explicit position_ids (a reset
    starts a new sequence that sees only itself): values known at run time only, so with `run_time_masks` off the
    mask is kept, and packed batches run exactly."""
    model = tiny("llama", impl)
    kwargs = {**model.inputs(), "use_cache": False}
    seq = kwargs["input_ids"].shape[1]
    kwargs["position_ids"] = torch.arange(seq).expand(2, -1)
    torch._dynamo.reset()
    recorder = Recorder(run_time_masks=False)
    compiled = torch.compile(model.forward, backend=recorder)
    assert_matches_eager(compiled, model, kwargs)
    kwargs["position_ids"] = torch.cat([torch.arange(5), torch.arange(seq - 5)]).expand(2, -1)  # two packed
    assert_matches_eager(compiled, model, kwargs)
    assert len(recorder.graphs) == 1 and recorder.count() == 0
    assert len(recorder.reasons) == model.attention_layers
    assert all("the graph input l_kwargs_position_ids_" in r for r in recorder.reasons), recorder.reasons


@pytest.mark.parametrize("name, impl, window_left", [case("llama", "sdpa", -1), case("mistral", "sdpa", 3, slow=True),
                                                     case("llama", "eager", -1)])
def test_packed_sequences_reach_the_op_with_run_time_masks(name, impl, window_left, monkeypatch):
    """`run_time_masks` (on by default): packed sequences from explicit position_ids (HF's mask, values known at run
    time only) reach every layer of the op as its key mask per query row, output equal to eager; the op reads that
    mask on the host as sequences packed back to back (`MaskKind.segments`: FA4 varlen on CUDA), Mistral's within
    its sliding window of 4 keys. A training step too, gradients eager's: sdpa code's boolean mask and eager code's
    float one (0 and finfo.min, added to the scores; on CUDA FA4 varlen forward and backward, rows that see no key
    given eager's gradient, `blind_rows_gradients`)."""
    model = tiny(name, impl)
    kwargs = {**model.inputs(), "use_cache": False}
    seq = kwargs["input_ids"].shape[1]
    kwargs["position_ids"] = torch.cat([torch.arange(5), torch.arange(seq - 5)]).expand(2, -1)
    masks = []
    real = reference.forward
    monkeypatch.setattr(reference, "forward", lambda *a, **kw: masks.append(a[4]) or real(*a, **kw))
    recorder, got = compile_and_run(model.forward, kwargs)
    assert_every_layer_rewritten(recorder, model)
    described = "key_mask=" + ("mask per query row" if impl == "sdpa" else "additive mask input")
    assert all(described in r.detail for r in recorder.records), recorder.records
    with torch.no_grad():
        torch.testing.assert_close(got, model.forward(**kwargs), atol=1e-5, rtol=1e-5)
    assert masks[0].dtype == (torch.bool if impl == "sdpa" else torch.float32) and masks[0].shape == (2, seq, seq)
    flags = dict(scale=0.25, causal=False, window_left=-1, window_right=-1, softcap=0.0)
    read = attention_op._per_query_mask_kind(None, masks[0], flags)
    assert read == attention_op.MaskKind("packed", window_left, ((0, 5, seq, seq + 5, 2 * seq), seq - 5, None)), read
    net = model.model.train()
    training = {**kwargs, "labels": kwargs["input_ids"]}
    assert_every_layer_rewritten(assert_training_step_matches_eager(net, training), model, graphs=None)


def without_dropout(model: nn.Module) -> nn.Module:
    """GPT-2's default config drops 10% of attention weights, hidden states and embeddings in training; GPT-BigCode
    keeps its attention's rate as a float it hands SDPA."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        for key, rate in list(vars(module).items()):
            if isinstance(rate, float) and ("dropout" in key or "pdrop" in key):
                setattr(module, key, 0.0)
    return model


def training_step(fn, model: nn.Module, kwargs: dict) -> tuple[torch.Tensor, list]:
    model.zero_grad()
    loss = fn(**kwargs).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def assert_training_step_matches_eager(model: nn.Module, kwargs: dict, **options) -> Recorder:
    torch._dynamo.reset()
    recorder = Recorder(**options)
    got = training_step(torch.compile(model, backend=recorder), model, kwargs)
    expected = training_step(model, model, kwargs)
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)
    for g, e in zip(got[1], expected[1]):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-4)
    return recorder


# One attention code per family, both for Llama.
TRAINED = [*(case(name, impl) for name, impl in SHORT_LIST), *(case(name, impl, slow=True) for name, impl in (
    ("qwen3", "sdpa"), ("mistral", "sdpa"), ("qwen2", "eager"), ("phi3", "sdpa"), ("gpt_neox", "eager"),
    ("gpt2", "sdpa"), ("gpt_oss", "eager"), ("gemma3n_text", "sdpa"), ("gemma4_text", "sdpa"),
    ("granite_swa", "eager"), ("gpt_neo", "eager"), ("gpt_bigcode", "sdpa")))]
# GPT-OSS: attention sinks, whose gradient reaches them through lse; Gemma 3n: its second layer reuses the first
# one's K/V, so K/V's gradient sums both layers' parts; Gemma 4: sliding and full layers of two head widths; Granite
# SWA: sinks as a scale after @ v; GPT-Neo: windowed layers from a causal buffer; GPT-BigCode: multi-query.


@pytest.mark.parametrize("name, impl", TRAINED)
def test_training_step(name, impl):
    """`model.train()`, labels, use_cache=False: the op's backward gives eager's loss and gradients. (The loss
    may be a graph of its own: transformers' first warning breaks the graph.)"""
    model = tiny(name, impl)
    net = without_dropout(model.model).train()
    kwargs = {**model.inputs(), "use_cache": False}
    recorder = assert_training_step_matches_eager(net, {**kwargs, "labels": kwargs["input_ids"]})
    assert_every_layer_rewritten(recorder, model, graphs=None, name=name)


@pytest.mark.parametrize("name, impl, side", [case("llama", "eager", "left"), case("llama", "sdpa", "left"),
                                              case("llama", "eager", "right", slow=True),
                                              case("qwen3", "eager", "left", slow=True),
                                              case("mistral", "sdpa", "left", slow=True),
                                              case("gemma2", "eager", "left", slow=True),
                                              case("gpt_oss", "eager", "left", slow=True)])
def test_training_step_with_a_padding_mask(name, impl, side):
    """A padded batch with labels: the key mask's backward. A left-padded row sees no key: sdpa code gives it zeros
    and no gradient, eager code's finfo.min mask the mean of V and, through its softmax, a gradient to q and k,
    which `blind_rows_as_eagers` gives too. Through Gemma-2's softcap it does not: kept, with the reason. The labels
    are the input ids, pad positions included (as a script that copies input_ids has them), so that the rows that
    see no key get a gradient."""
    model = tiny(name, impl)
    net = without_dropout(model.model).train()
    kwargs = {**model.inputs(), "use_cache": False}
    kwargs["attention_mask"] = padding_mask(side, 2, kwargs["input_ids"].shape[1])
    labels = kwargs["input_ids"]
    recorder = assert_training_step_matches_eager(net, {**kwargs, "labels": labels})
    if name != "gemma2":
        assert_every_layer_rewritten(recorder, model, graphs=None, name=name)
    else:
        assert recorder.count() == 0 and all("in training under a softcap" in r for r in recorder.reasons), \
            recorder.reasons


@pytest.mark.slow
def test_active_dropout_in_training_stays_as_written():
    """GPT-2's default 10% attention dropout in training: kept as written, with the reason."""
    model = tiny("gpt2", "sdpa")
    net = model.model.train()
    kwargs = {**model.inputs(), "use_cache": False}
    torch._dynamo.reset()
    recorder = Recorder()
    torch.compile(net, backend=recorder)(**kwargs, labels=kwargs["input_ids"]).loss.backward()
    assert recorder.count() == 0
    assert recorder.reasons and all("dropout" in r for r in recorder.reasons), recorder.reasons


GROWING = [case("llama", "eager", None), case("mistral", "sdpa", "left", slow=True), case("gemma2", "eager", None, slow=True)]


@pytest.mark.parametrize("name, impl, padding", GROWING)
def test_growing_lengths_without_cache(name, impl, padding):
    """Three sequence lengths: the second compile has symbolic lengths (automatic dynamic shapes), and the
    third reuses it."""
    model = tiny(name, impl)
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(model.forward, backend=recorder)
    for seq in (8, 10, 12):
        kwargs = {**model.inputs(seq=seq), "use_cache": False}
        if padding:
            kwargs["attention_mask"] = padding_mask(padding, 2, seq)
        assert_matches_eager(compiled, model, kwargs)
    assert_every_layer_rewritten(recorder, model, graphs=2)


@pytest.mark.parametrize("name, impl, cache", [case("llama", "sdpa", "no-cache"),
                                               case("mistral", "eager", "no-cache", slow=True),
                                               case("llama", "sdpa", "cache", slow=True),
                                               case("mistral", "eager", "cache", slow=True)])
def test_dynamic_true(name, impl, cache):
    """`dynamic=True`: one graph for every batch size and length."""
    model = tiny(name, impl)
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(model.forward, backend=recorder, dynamic=True)
    for batch, seq in ((2, 8), (3, 11), (4, 5)):
        assert_matches_eager(compiled, model, {**model.inputs(batch=batch, seq=seq), "use_cache": cache == "cache"})
    assert_every_layer_rewritten(recorder, model)


@pytest.mark.parametrize("impl", [case("eager"), case("sdpa", slow=True)])
def test_training_steps_under_dynamic_true(impl):
    """`dynamic=True` in training: HF passes the attention dropout (0.0) as a float, which Dynamo leaves symbolic;
    it is read as 0 under a guard, so every layer is rewritten, in one graph for padded batches of two lengths, with
    eager's loss and gradients."""
    model = tiny("llama", impl)
    net = without_dropout(model.model).train()
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(net, backend=recorder, dynamic=True)
    for seq in (12, 17):
        ids = torch.randint(3, model.model.config.vocab_size, (2, seq))
        kwargs = dict(input_ids=ids, attention_mask=padding_mask("left", 2, seq), use_cache=False, labels=ids)
        got, expected = training_step(compiled, net, kwargs), training_step(net, net, kwargs)
        torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)
        for g, e in zip(got[1], expected[1]):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-4)
    assert len(recorder.graphs) == 1 and recorder.count() == model.attention_layers, recorder.reasons


@pytest.mark.parametrize("impl", [case("sdpa", slow=True), case("eager", slow=True)])
def test_padded_batch_after_unpadded_ones_under_dynamic_true(impl):
    """A server's order under `dynamic=True`: one request alone, then a batch, then a padded batch. The batch size
    has one symbol in the ids (dynamic since the second graph) and a fresh one in the mask, first seen in the third;
    HF's lookup `mask[arange(B)[:, None, None, None], kv_idx]` is read as the key mask under a guard that they are
    equal (the size sweep's padded rows kept SDPA without it)."""
    model = tiny("llama", impl)
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(model.forward, backend=recorder, dynamic=True)
    for batch, padding in ((1, None), (2, None), (2, "left"), (3, "left")):
        kwargs = {**model.inputs(batch=batch, seq=9), "use_cache": False}
        if padding:
            kwargs["attention_mask"] = padding_mask(padding, batch, 9)
        assert_matches_eager(compiled, model, kwargs)
    assert_every_layer_rewritten(recorder, model, graphs=3)
    assert all("key_mask=padding mask" in r.detail or r.detail.startswith(CROSSOVER_ROUTES)
               for r in recorder.records[-model.attention_layers:]), recorder.records


@pytest.mark.parametrize("name, impl, padding", [case("mistral", "sdpa", None, slow=True),
                                                 case("llama", "eager", None, slow=True),
                                                 case("llama4_text", "sdpa", "left"),
                                                 case("llama4_text", "eager", "left", slow=True)])
def test_dynamic_cache_decode_with_an_attention_mask(name, impl, padding):
    """Prefill and two one-token steps through the DynamicCache the model makes, with generate's growing
    attention_mask: from the first step the mask's length is symbolic, and a sliding-window layer reads it from a
    constant key offset. Llama 4's chunked layers over a left-padded batch place their chunks by each row's padding,
    which the graph reads from the mask's values: the prefill's mask reaches the op as a key mask per query row, and
    each step's one row (boolean, or eager code's float) as the decode's key mask."""
    model = tiny(name, impl).model
    if name == "llama4_text":
        model.config.attention_chunk_size = 4  # the second row's last chunk starts at its token 4, the cache's 7
    ids, mask = torch.randint(0, 128, (2, 8)), padding_mask(padding or "none", 2, 8)
    keyword = hf.cache_keyword(model)

    def generate(fn):
        with torch.no_grad():
            out = fn(input_ids=ids[:, :6], attention_mask=mask[:, :6], use_cache=True)
            logits = [out.logits]
            for t in (6, 7):
                out = fn(input_ids=ids[:, t:t + 1], attention_mask=mask[:, :t + 1], use_cache=True,
                         **{keyword: out.past_key_values})
                logits.append(out.logits)
        return logits

    torch._dynamo.reset()
    recorder = Recorder()
    for got, expected in zip(generate(torch.compile(model, backend=recorder)), generate(model)):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert layers_served(recorder) == len(recorder.graphs) * model.config.num_hidden_layers, recorder.records
    assert not other_reasons(recorder), recorder.reasons


def chunked_causal_mask(masking_utils, config, embeds, mask_2d):
    """`create_chunked_causal_mask` over a prompt without a cache; transformers 4 takes its cache_position."""
    if "cache_position" in inspect.signature(masking_utils.create_chunked_causal_mask).parameters:
        return masking_utils.create_chunked_causal_mask(config, embeds, mask_2d, torch.arange(embeds.shape[1]), None)
    return masking_utils.create_chunked_causal_mask(config, embeds, mask_2d, None)


CHUNKED = [pytest.param(4, False, "chunked attention", id="longer-than-a-chunk"),
           pytest.param(16, False, None, id="within-a-chunk"),
           pytest.param(16, True, "the graph input l_mask_2d_", id="within-a-chunk-padded")]


@pytest.mark.parametrize("chunk, padded, reason", CHUNKED)
def test_chunked_attention(chunk, padded, reason):
    """Llama 4's chunked layers (`create_chunked_causal_mask`, eager code's float mask): blocks along the
    diagonal, not a band, unless the sequence fits in one chunk and there is no attention_mask (whose left
    padding would move the blocks): then it is causal."""
    masking_utils = pytest.importorskip("transformers.masking_utils")
    config = hf.tiny_config("llama", "eager")
    config.attention_chunk_size = chunk

    def chunked(q, k, v, mask_2d):
        mask = chunked_causal_mask(masking_utils, config, q.transpose(1, 2).flatten(2), mask_2d)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    mask_2d = padding_mask("left", 2, 8) if padded else None
    torch._dynamo.reset()
    recorder = Recorder()
    torch.testing.assert_close(torch.compile(chunked, backend=recorder)(q, k, v, mask_2d), chunked(q, k, v, mask_2d))
    if reason is None:
        assert recorder.count() == 1 and "causal=True" in recorder.records[0].detail, recorder.records
    else:
        assert recorder.count() == 0 and len(recorder.reasons) == 1 and reason in recorder.reasons[0], recorder.reasons


LEFT_PADDED_CHUNKS = ((0, 3, 6, 11, 14, 16), 3, (3, 3, 2, 3, 2))
"""Chunks of 3 over 8 tokens, the second of 2 rows left-padded by `padding_mask("left", 2, 8)`'s 3 tokens: its first
chunk is all padding, its rows 0-2 see no key (tokens 8-10 of the flattened 16, a gap after the first row's last
chunk), its chunks [3, 6) and [6, 8) are segments at 11 and 14."""


def test_chunked_attention_longer_than_a_chunk_with_run_time_masks(monkeypatch):
    """`run_time_masks` (on by default): Llama 4's chunked mask over 8 tokens in chunks of 3 reaches the op as its key
    mask per query row, which the op reads on the host as sequences packed back to back (FA4 varlen on CUDA), with
    and without left padding (the pad rows, which see no key, left out of the segments: `LEFT_PADDED_CHUNKS`)."""
    masking_utils = pytest.importorskip("transformers.masking_utils")
    config = hf.tiny_config("llama", "sdpa")  # a boolean mask (eager code's is float, added to the scores)
    config.attention_chunk_size = 3

    def chunked(q, k, v, mask_2d):
        mask = chunked_causal_mask(masking_utils, config, q.transpose(1, 2).flatten(2), mask_2d)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    masks = []
    real = reference.forward
    monkeypatch.setattr(reference, "forward", lambda *a, **kw: masks.append(a[4]) or real(*a, **kw))
    flags = dict(scale=0.25, causal=False, window_left=-1, window_right=-1, softcap=0.0)
    for mask_2d, read in ((None, attention_op.MaskKind("packed", segments=((0, 3, 6, 8, 11, 14, 16), 3, None))),
                          (padding_mask("left", 2, 8), attention_op.MaskKind("packed", segments=LEFT_PADDED_CHUNKS))):
        torch._dynamo.reset()
        recorder = Recorder()
        torch.testing.assert_close(torch.compile(chunked, backend=recorder)(q, k, v, mask_2d),
                                   chunked(q, k, v, mask_2d))
        assert recorder.count() == 1 and "key_mask=mask per query row" in recorder.records[0].detail, recorder.records
        assert attention_op._per_query_mask_kind(None, masks[-1], flags) == read


def per_query_rows(q, k, v, weights):
    """A boolean mask built from a float input, one row per query."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=(weights[..., :q.shape[2], :] > 0)[:, None],
                                          enable_gqa=True)


def one_row_of_chunks(q, k, v, shift):
    """The last query's chunk of 4 keys, the chunks moved by each sequence's shift: one row, [B, 1, 1, Sk]."""
    sk, b = k.shape[2], torch.arange(q.shape[0])[:, None, None, None]
    keys = (torch.arange(sk)[None, None, None, :] - shift[b]) // 4 == (sk - 1 - shift[b]) // 4
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keys, enable_gqa=True)


@pytest.mark.parametrize("attend, sq, sk, read_as", [
    (per_query_rows, 8, 8, "key_mask=mask per query row"), (per_query_rows, 8, 11, None),
    (one_row_of_chunks, 1, 40, "key_mask="), (one_row_of_chunks, 24, 40, None)],
    ids=["per-query-self-attention", "per-query-over-a-cache", "one-row-decode-step", "one-row-many-queries"])
def test_run_time_masks_over_a_cache_only_for_a_decode_step(attend, sq, sk, read_as):
    """A boolean mask the graph cannot prove reaches the op as its key mask: one row per query on a self-attention, one
    row for every query over a decode step's few queries. Over a KV cache with more queries it stays as written, where
    the op's SDPA fallback would repeat the cache's K/V for GQA."""
    q = torch.randn(2, 4, sq, 16)
    k, v = (torch.randn(2, 2, sk, 16) for _ in range(2))
    data = torch.randn(2, sq, sk) if attend is per_query_rows else torch.tensor([1, 2])
    if attend is per_query_rows:
        data[..., 0] = 1.0  # every query sees a key
    torch._dynamo.reset()
    recorder = Recorder()
    torch.testing.assert_close(torch.compile(attend, backend=recorder)(q, k, v, data), attend(q, k, v, data))
    if read_as:
        assert recorder.count() == 1 and read_as in recorder.records[0].detail, recorder.records
    else:
        assert recorder.count() == 0 and "mask not recognized" in recorder.reasons[0], recorder.reasons


def cache_position_attention(q, k_new, v_new, k_past, v_past):
    """transformers 4.x with a DynamicCache: `cache_position = arange(past, past + Sq)` (past: the cache length,
    a SymInt under dynamic shapes), keys the past ones and the new ones, `kv_arange <= cache_position`."""
    past = k_past.shape[2]
    cache_position = torch.arange(past, past + q.shape[2])
    k, v = torch.cat([k_past, k_new], 2), torch.cat([v_past, v_new], 2)
    mask = upstream.causal_mask(cache_position, torch.arange(k.shape[2]), q.shape[0])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_cache_position_of_older_transformers(dynamic):
    """Queries at `arange(past, past + Sq)` over past + Sq keys: seqused_k aligns the band bottom-right, for a
    constant or a symbolic past length."""
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(cache_position_attention, backend=recorder, dynamic=dynamic)
    for past, sq in ((5, 3), (7, 1), (4, 4)):
        q, k_new, v_new = torch.randn(2, 4, sq, 16), torch.randn(2, 4, sq, 16), torch.randn(2, 4, sq, 16)
        k_past, v_past = torch.randn(2, 4, past, 16), torch.randn(2, 4, past, 16)
        torch.testing.assert_close(compiled(q, k_new, v_new, k_past, v_past),
                                   cache_position_attention(q, k_new, v_new, k_past, v_past), atol=1e-5, rtol=1e-5)
    assert recorder.count() == len(recorder.graphs) and not recorder.reasons, recorder.reasons
    assert all("seqused_k" in r.detail and "causal=True" in r.detail for r in recorder.records), recorder.records


def static_cache_attention(q, k_new, v_new, k_cache, v_cache, cache_position):
    """transformers 4's StaticCache under generate: `cache_position` [Sq] (a graph input, generate's
    `arange(past, past + Sq)`) places the new K/V in the cache, and the mask compares every slot with it."""
    keys, values = upstream.static_cache_update(k_cache, v_cache, k_new, v_new, cache_position)
    mask = upstream.causal_mask(cache_position, torch.arange(keys.shape[2]), q.shape[0])
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)


def test_cache_position_input_of_older_transformers():
    """A `cache_position` graph input is read as `cache_position[0] + arange(Sq)` (the op's seqused_k over the cache,
    causal) under a run-time check that it counts up by one: positions that do not raise, never a wrong answer."""
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(static_cache_attention, backend=recorder)
    k_cache, v_cache = torch.randn(2, 4, 12, 16), torch.randn(2, 4, 12, 16)
    for past, sq in ((0, 5), (5, 1), (6, 1)):
        q, k_new, v_new = (torch.randn(2, 4, sq, 16) for _ in range(3))
        positions = torch.arange(past, past + sq)
        expected = static_cache_attention(q, k_new, v_new, k_cache.clone(), v_cache.clone(), positions)
        torch.testing.assert_close(compiled(q, k_new, v_new, k_cache, v_cache, positions), expected,
                                   atol=1e-5, rtol=1e-5)
    assert recorder.count() == len(recorder.graphs) == 2 and not recorder.reasons, recorder.reasons
    assert all("seqused_k=cache position + Sq" in r.detail and "causal=True" in r.detail for r in recorder.records)
    q, k_new, v_new = (torch.randn(2, 4, 5, 16) for _ in range(3))
    with pytest.raises(RuntimeError, match="do not count up by one"):
        compiled(q, k_new, v_new, k_cache, v_cache, torch.tensor([0, 1, 2, 4, 5]))


def concatenated_cache_attention(q, k_new, v_new, k_past, v_past, cache_position):
    """transformers 4's DynamicCache under generate: `cache_position` [Sq] a graph input (generate's
    `arange(past, past + Sq)`), the keys the past ones and the new ones concatenated: no write at the positions
    bounds them to the keys."""
    k, v = torch.cat([k_past, k_new], 2), torch.cat([v_past, v_new], 2)
    mask = upstream.causal_mask(cache_position, torch.arange(k.shape[2]), q.shape[0])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("past, sq, form", [(0, 5, "mask per query row"), (6, 1, "padding mask")],
                         ids=["prefill", "decode"])
def test_cache_position_input_over_concatenated_keys(past, sq, form):
    """Positions from a `cache_position` input over concatenated keys can leave the keys, which the band the mask is
    proven to be cannot say (seqused_k): the mask the graph computes goes to the op as its key mask instead, read at
    run time, eager's output for any positions (generate's, shifted ones, ones past the last key)."""
    torch._dynamo.reset()
    recorder = Recorder()
    compiled = torch.compile(concatenated_cache_attention, backend=recorder)
    q, k_new, v_new = (torch.randn(2, 4, sq, 16) for _ in range(3))
    k_past, v_past = torch.randn(2, 4, past, 16), torch.randn(2, 4, past, 16)
    for start in (past, past - 1 if past else 2, past + 3):
        positions = torch.arange(start, start + sq)
        torch.testing.assert_close(compiled(q, k_new, v_new, k_past, v_past, positions),
                                   concatenated_cache_attention(q, k_new, v_new, k_past, v_past, positions),
                                   atol=1e-5, rtol=1e-5)
    assert recorder.count() == len(recorder.graphs) == 1 and not recorder.reasons, recorder.reasons
    assert f"key_mask={form}" in recorder.records[0].detail and "seqused_k" not in recorder.records[0].detail
    recorder = Recorder(run_time_masks=False)
    torch._dynamo.reset()
    torch.compile(concatenated_cache_attention, backend=recorder)(q, k_new, v_new, k_past, v_past, positions)
    assert recorder.count() == 0 and "not a KV cache written in this graph" in recorder.reasons[0], recorder.reasons


@pytest.mark.parametrize("impl", [pytest.param("eager", marks=pytest.mark.slow), "sdpa"])
def test_greedy_generate_over_a_compiled_forward(impl):
    """`generate` with the DynamicCache it makes, over a compiled forward, a left-padded batch: the prefill and every
    step of every layer on the op (transformers 4: the masks, at `cache_position`'s positions, as run-time key masks),
    the tokens uncompiled generate's."""
    model = tiny("llama", impl).model
    model.generation_config.pad_token_id = 0
    ids = torch.randint(3, 128, (2, 7), generator=torch.Generator().manual_seed(2))
    mask = padding_mask("left", 2, 7)
    forward = model.forward
    torch._dynamo.reset()
    recorder = Recorder()
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
        model.forward = torch.compile(forward, backend=recorder)
        try:
            got = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
        finally:
            model.forward = forward
    assert torch.equal(got, expected)
    assert recorder.count() == len(recorder.graphs) * model.config.num_hidden_layers and not recorder.reasons, \
        recorder.records


@pytest.mark.parametrize("code", ["sdpa", "eager"])
def test_older_update_causal_mask_of_transformers_4(code):
    """transformers 4's older `_update_causal_mask` (OPT, BioGPT, Falcon, Nemotron in 4.57: a clone of the causal
    triangle with the padded mask written over it whole, `lowering/overwritten_masks.py`) reaches the op as the
    causal band and the attention_mask as its key mask, left padding included, in SDPA and in eager code."""
    def attend(q, k, v, attention_mask):
        mask = upstream.update_causal_mask_4x(attention_mask, torch.arange(q.shape[2]), k.shape[2], q.dtype)
        if code == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + mask, -1) @ v

    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    torch._dynamo.reset()
    recorder = Recorder(run_time_masks=False)
    compiled = torch.compile(attend, backend=recorder)
    keep = padding_mask("left", 2, 8)
    torch.testing.assert_close(compiled(q, k, v, keep), attend(q, k, v, keep), atol=1e-5, rtol=1e-5)
    assert recorder.count() == 1 and not recorder.reasons, recorder.reasons
    assert "key_mask=padding mask" in recorder.records[0].detail and "causal=True" in recorder.records[0].detail


GENERATE_STRATEGIES = {
    "beam search": dict(num_beams=3, max_new_tokens=4, do_sample=False),
    "sampling": dict(do_sample=True, top_k=5, max_new_tokens=4),
    "prompt lookup": dict(prompt_lookup_num_tokens=3, max_new_tokens=6, do_sample=False),
    "beam search, static cache": dict(num_beams=2, max_new_tokens=4, do_sample=False, cache_implementation="static"),
}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", GENERATE_STRATEGIES)
def test_generate_strategies_with_a_compiled_forward(strategy):
    """`generate` strategies other than greedy over a compiled forward: beam search (the cache reordered between
    steps), sampling, prompt-lookup decoding (several candidate tokens verified over the cache at once: a causal band
    at the cache's offset) and beams over a static cache with a left-padded batch. Every attention layer of every
    graph is rewritten, and the tokens are uncompiled generate's."""
    model = tiny("llama", "sdpa").model
    model.generation_config.pad_token_id = 0
    ids = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    ids[:, 4:7] = ids[:, 0:3]  # a repeated n-gram for prompt lookup to find
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    if strategy == "prompt lookup":  # batch 1 only
        ids, mask = ids[:1], mask[:1]
    kwargs = GENERATE_STRATEGIES[strategy]
    forward = model.forward
    torch._dynamo.reset()
    recorder = Recorder()
    with torch.no_grad():
        torch.manual_seed(0)
        expected = model.generate(ids, attention_mask=mask, **kwargs)
        model.forward = torch.compile(forward, backend=recorder)
        torch.manual_seed(0)
        got = model.generate(ids, attention_mask=mask, **kwargs)
    model.forward = forward
    assert torch.equal(got, expected)
    layers = model.config.num_hidden_layers
    if strategy == "prompt lookup" and hf.transformers_major() < 5:
        # transformers 4 passes cache_position over a DynamicCache's concatenated keys; a step's mask for several
        # candidate tokens over the cache has no run-time form the op takes (`attention.run_time_mask`): as written
        assert all("not a KV cache written in this graph" in r for r in recorder.reasons), recorder.reasons
        assert recorder.count() + len(recorder.reasons) == len(recorder.graphs) * layers
        assert recorder.count() >= 2 * layers  # the prefill and the one-token steps
        return
    assert recorder.count() == len(recorder.graphs) * layers and not recorder.reasons, recorder.records


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bart", "t5"])
@pytest.mark.parametrize("strategy", ["greedy", "beam search", "static cache"])
def test_encoder_decoder_generate_with_a_compiled_forward(name, strategy):
    """Encoder-decoder `generate` over a compiled forward, a right-padded batch: the encoder's padded self-attention,
    the decoder's causal self-attention over its cache and its cross-attention over the encoder's keys take the op
    (T5's learned position bias is kept, with its reason), and the tokens are uncompiled generate's."""
    transformers = pytest.importorskip("transformers")
    if hf.unsupported(name, "sdpa"):  # T5 has sdpa code from transformers 5
        pytest.skip(hf.unsupported(name, "sdpa"))
    torch.manual_seed(0)
    model = transformers.AutoModelForSeq2SeqLM.from_config(hf.tiny_config(name, "sdpa"), attn_implementation="sdpa")
    model = model.eval()
    model.generation_config.pad_token_id = model.config.pad_token_id or 0
    model.generation_config.decoder_start_token_id = getattr(model.config, "decoder_start_token_id", None) or 0
    ids = torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    kwargs = {"greedy": {}, "beam search": {"num_beams": 2}, "static cache": {"cache_implementation": "static"}}
    forward = model.forward
    torch._dynamo.reset()
    recorder = Recorder()
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, **kwargs[strategy])
        model.forward = torch.compile(forward, backend=recorder)
        got = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, **kwargs[strategy])
    model.forward = forward
    assert torch.equal(got, expected)
    assert recorder.count() > 0
    # transformers 4 passes cache_position over a DynamicCache's concatenated keys: a position past the keys cannot be
    # excluded, and BART's float mask on SDPA has no run-time form the op takes, so its self-attention stays as written
    kept = "learned position bias" if name == "t5" else "not a KV cache written in this graph at indexed positions"
    expect_kept = name == "t5" or (hf.transformers_major() < 5 and strategy != "static cache")
    assert all(kept in r for r in recorder.reasons) and expect_kept == bool(recorder.reasons), recorder.reasons


@pytest.mark.parametrize("model_kind", ["nanogpt-sdpa", "llama-sdpa",
                                        *(pytest.param(kind, marks=pytest.mark.slow)
                                          for kind in ("nanogpt-handwritten", "llama-eager"))])
def test_training_step_under_autocast(model_kind):
    """A float32 model trained under `torch.autocast(dtype=torch.bfloat16)` (nanoGPT's train.py): the projections
    hand attention bfloat16 q, k, v, so it is rewritten, and the op runs in bfloat16 as SDPA would. The loss and every
    gradient are as close to the float64 model's as eager autocast's are (within 2x, plus a bfloat16 step)."""
    torch.manual_seed(0)
    if model_kind.startswith("nanogpt"):
        net = upstream.CausalSelfAttention(n_embd=64, n_head=4, block_size=32, dropout=0.0,
                                           flash=model_kind == "nanogpt-sdpa").train()
        x = torch.randn(2, 32, 64)

        def loss_of(module, x):
            return module(x).float().square().mean()
    else:
        net = without_dropout(tiny("llama", model_kind.removeprefix("llama-")).model).train()
        x = torch.randint(0, 128, (2, 12))

        def loss_of(module, x):
            return module(input_ids=x, labels=x, use_cache=False).loss

    def step(module, autocast: bool):
        net.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_of(module, x)
        loss.backward()
        return [loss.detach()] + [p.grad.clone() for p in net.parameters()]

    net.double()
    x = x.double() if x.is_floating_point() else x
    reference = step(net, autocast=False)
    net.float()
    x = x.float() if x.is_floating_point() else x
    eager = step(net, autocast=True)
    torch._dynamo.reset()
    recorder = Recorder()
    got = step(torch.compile(net, backend=recorder), autocast=True)
    assert recorder.count() >= 1 and not recorder.reasons, recorder.records
    for i, (g, e, r) in enumerate(zip(got, eager, reference)):
        assert_as_close_as_eager(f"tensor {i} (eager under autocast)", g, e, r, 2 ** -8)


@pytest.mark.parametrize("impl, padded", [("sdpa", False), ("sdpa", True),
                                          *(pytest.param(*case, marks=pytest.mark.slow)
                                            for case in (("eager", False), ("eager", True)))])
def test_training_step_with_gradient_checkpointing(request, impl, padded):
    """`gradient_checkpointing_enable()` (HF Trainer's `gradient_checkpointing=True`) puts each decoder layer in a
    `torch.utils.checkpoint` region, which Dynamo writes as a subgraph: its attention is rewritten there too. HF's
    mask, built before the layers, enters the region as an input, proven from the enclosing graph when it is pure
    structure (the causal band of an unpadded batch); a padded batch's depends on `attention_mask`: sdpa code's
    boolean mask becomes the op's key mask per query row, eager code's float one stays as written (values unknown
    when compiling). Loss and gradients are eager's.

    transformers >= 5.25 with Hugging Face's `kernels` installed (a dependency from 5.25) routes the attention's
    rotary function through a context variable that its forward sets, a side effect inside the checkpoint that Dynamo
    refuses (a graph break per layer, which then runs uncompiled under any backend) unless told it need not replay it
    in the backward: the setting a user follows Dynamo's hint to, set here as they would."""
    flag = "skip_fwd_side_effects_in_bwd_under_checkpoint"
    if hasattr(torch._dynamo.config, flag):  # config.patch: torch 2.14's config loses a monkeypatched name on undo
        patch = torch._dynamo.config.patch(**{flag: True})
        patch.__enter__()
        request.addfinalizer(lambda: patch.__exit__(None, None, None))
    model = tiny("llama", impl)
    net = without_dropout(model.model).train()
    if hasattr(net, "activation_checkpointing_enable"):  # transformers >= 5.25; the old name warns there
        net.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    kwargs = {**model.inputs(padding=padded), "use_cache": False}
    if padded:
        kwargs["attention_mask"] = kwargs["attention_mask"].flip(-1)  # left padding
    recorder = assert_training_step_matches_eager(net, {**kwargs, "labels": kwargs["input_ids"]})
    layers = model.attention_layers
    assert len(recorder.records) == layers, recorder.records
    if not padded:
        assert all(r.rewritten and "causal=True" in r.detail and "key_mask" not in r.detail
                   for r in recorder.records), recorder.records
        assert sorted(r.module.split("model.")[-1] for r in recorder.records) == [
            f"layers.{i}.self_attn" for i in range(layers)]
    elif impl == "sdpa":
        assert all(r.rewritten and "key_mask=mask per query row" in r.detail for r in recorder.records), \
            recorder.records
    else:
        assert all("the graph input" in reason for reason in recorder.reasons), recorder.reasons
