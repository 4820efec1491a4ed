"""test_call_modes.py's call modes as a CUDA run compiles them: with lowering's small-attention crossover
(lowering/crossover.py), which on CUDA sends the zoo's tiny models' attentions to SDPA. Each layer goes to
`fa4::attention`, becomes the SDPA call that computes it, or stays the SDPA call the model makes, and outputs,
losses and gradients match eager's as they do without the crossover.

This is where a crossover rule that computes something else shows (session 17: a small left-padded attention of
HF's eager code, in training, made SDPA with the padding mask, lost eager's gradient through the query rows that
see no key)."""

import pytest
import torch

import test_call_modes as modes
import test_model_zoo as zoo
from fa4_inductor import hf
from fa4_inductor.lowering import crossover

pytestmark = pytest.mark.slow  # about a minute on 2 cores: the fast tier's 5 minutes


@pytest.fixture(autouse=True)
def cpu_counts_as_cuda(monkeypatch):
    monkeypatch.setattr(crossover, "DEVICES", ("cuda", "cpu"))


test_without_cache = modes.test_without_cache
test_padding_masks = modes.test_padding_masks
test_position_ids = modes.test_position_ids
test_training_step = modes.test_training_step
test_training_step_with_a_padding_mask = modes.test_training_step_with_a_padding_mask
test_growing_lengths_without_cache = modes.test_growing_lengths_without_cache
test_dynamic_true = modes.test_dynamic_true
test_dynamic_cache_decode_with_an_attention_mask = modes.test_dynamic_cache_decode_with_an_attention_mask


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_the_tiny_models_attentions_are_all_small(impl):
    """The modes above exercise the crossover: a tiny Llama's every layer is on SDPA, none on the op."""
    model = modes.tiny("llama", impl)
    recorder, _ = modes.compile_and_run(model.forward, {**model.inputs(), "use_cache": False})
    assert recorder.count() == 0 and modes.layers_served(recorder) == model.attention_layers, recorder.records


# The model zoo (test_model_zoo.py) under the crossover: every family's prefill, padded or not, and its static-cache
# decode, counted as above. Heavier than the call modes: the slow tier.

@pytest.mark.slow
@pytest.mark.parametrize("name, impl, padding", zoo.prefill_cases())
def test_zoo_prefill(name, impl, padding):
    zoo.skip_where_dynamo_fails_on_transformers_4(name, impl)
    model = modes.tiny(name, impl)
    kwargs = model.inputs(padding=padding is not None)
    if padding == "left":
        kwargs["attention_mask"] = kwargs["attention_mask"].flip(-1)
    recorder, got = modes.compile_and_run(model.forward, kwargs)
    with torch.no_grad():
        torch.testing.assert_close(got, model.forward(**kwargs), atol=1e-5, rtol=1e-5)
    if padding and zoo.kept_on_transformers_4(name, impl, recorder):
        return
    assert modes.layers_served(recorder) == model.attention_layers, [str(r) for r in recorder.records]
    assert not modes.other_reasons(recorder), recorder.reasons


@pytest.mark.slow
@pytest.mark.parametrize("impl", zoo.IMPLEMENTATIONS)
@pytest.mark.parametrize("name", zoo.DECODERS)
def test_zoo_static_cache_decode(name, impl):
    """Prefill and five decode steps with generate's all-ones mask: sdpa code's decode steps stay SDPA calls as
    written (`small_decode`; most families' six-token prompt over the cache's 16 keys too), eager code's go to the
    op."""
    model = modes.tiny(name, impl)
    prompt, steps = torch.randint(0, 128, (2, 6)), torch.randint(0, 128, (2, 5))
    torch._dynamo.reset()
    recorder = modes.Recorder()
    with torch.no_grad():
        compiled = torch.compile(model.forward, backend=recorder)
        got, _ = zoo.generate_with_static_cache(compiled, model.model, prompt, steps, attention_mask=True)
        expected, _ = zoo.generate_with_static_cache(model.forward, model.model, prompt, steps, attention_mask=True)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    assert len(recorder.graphs) == 2, recorder.records
    kept = zoo.KEPT_ON_TRANSFORMERS_4.get((name, impl)) or (
        (zoo.ROLLED_REASON,) if name in zoo.ROLLED_ON_TRANSFORMERS_4 else None)
    if hf.transformers_major() < 5 and kept:  # what the zoo asserts on 4.57, the rest on SDPA or the op
        assert all(any(k in r for k in kept) for r in modes.other_reasons(recorder)), recorder.reasons
        return
    assert modes.layers_served(recorder) == 2 * model.attention_layers, [str(r) for r in recorder.records]
    assert not modes.other_reasons(recorder), recorder.reasons
    decode_kept = [r for r in recorder.reasons if r.startswith("a decode step")]
    assert (len(decode_kept) >= model.attention_layers) if impl == "sdpa" else not decode_kept, recorder.reasons
