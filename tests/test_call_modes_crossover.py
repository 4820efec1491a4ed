"""test_call_modes.py's call modes as a CUDA run compiles them: with lowering's small-attention crossover
(lowering/crossover.py), which on CUDA sends the zoo's tiny models' attentions to SDPA. Each layer goes to
`fa4::attention`, becomes the SDPA call that computes it, or stays the SDPA call the model makes, and outputs,
losses and gradients match eager's as they do without the crossover.

This is where a crossover rule that computes something else shows (session 17: a small left-padded attention of
HF's eager code, in training, made SDPA with the padding mask, lost eager's gradient through the query rows that
see no key)."""

import pytest

import test_call_modes as modes
from fa4_inductor.lowering import crossover


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
