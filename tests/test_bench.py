"""The benchmark code paths, run on the CPU with tiny shapes (the numbers mean nothing here)."""

import math

import pytest
import torch

from fa4_inductor import bench, hf
from fa4_inductor.__main__ import main


@pytest.mark.slow
def test_op_suite_rows_cover_every_variant():
    table = bench.op_suite("cpu", torch.float32, seqlens=(64, 128), head_dims=(64,), tokens=256, width=128)
    assert [row[:4] for row in table.rows] == [
        [64, False, 64, "4x2"], [64, False, 128, "2x2"], [64, True, 64, "4x2"], [64, True, 128, "2x2"]]
    assert all(math.isfinite(x) and x > 0 for row in table.rows for x in row[4:6])
    assert "| head dim | causal |" in table.markdown()


@pytest.mark.slow
def test_backward_suite_times_forward_and_backward_of_each_implementation():
    table = bench.backward_suite("cpu", torch.float32, shapes=((4, 2, 16),), seqlens=(32, 64), tokens=64)
    assert [row[:3] for row in table.rows] == [["4/2x16", 32, 2], ["4/2x16", 64, 1]]
    assert table.columns[3:] == ["fa4::attention fwd", "SDPA math fwd", "fa4::attention fwd+bwd", "SDPA math fwd+bwd"]
    assert all(ms > 0 for row in table.rows for ms in row[3:]), table.rows


def test_decode_suite_skips_caches_over_the_memory_cap():
    table = bench.decode_suite("cpu", torch.float32, batches=(1,), cache_lens=(256, 4096), heads=((4, 2),),
                               head_dims=(64,), max_kv_gib=2 * 2 * 256 * 64 * 4 / 2**30)
    assert [row[:4] for row in table.rows] == [["4/2", 64, 1, 256]]
    assert all(cell != "n/a" for cell in table.rows[0][4:])


@pytest.mark.slow
def test_e2e_suite_compiles_prefill_and_static_cache_decode():
    tiny = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=128, max_position_embeddings=256)
    prefill, decode = bench.e2e_suite("cpu", torch.float32, seqlens=(16,), prompt=8, steps=5, model_overrides=tiny)
    assert "failed" not in prefill.markdown() + decode.markdown()
    assert [row[:2] for row in prefill.rows] == [["eager", 16], ["sdpa", 16]]
    assert [row[0] for row in decode.rows] == ["eager", "sdpa"]
    assert all(float(row[-1]) < 1e-4 for row in decode.rows), decode.rows


def test_bench_needs_a_gpu(monkeypatch, capsys):
    """Without a CUDA GPU (simulated on a machine that has one) the command refuses, with exit status 2."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--suite", "op"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.slow
def test_a_failed_measurement_is_reported_not_fatal(monkeypatch, capsys):
    tiny = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=128, max_position_embeddings=256)

    def broken(*args, **kwargs):
        raise AssertionError("seqused_k must be contiguous")

    monkeypatch.setattr(bench.llama_e2e, "decode_tokens_per_s", broken)
    prefill, decode = bench.e2e_suite("cpu", torch.float32, seqlens=(16,), prompt=8, steps=5, model_overrides=tiny)
    assert "failed" not in prefill.markdown()
    assert decode.rows[0][2:5] == ["failed", "failed", "n/a"]
    assert "seqused_k must be contiguous" in capsys.readouterr().err


@pytest.mark.slow
def test_generate_suite_runs_hf_generate_with_each_backend():
    tiny = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=128, max_position_embeddings=256)
    (table,) = bench.generate_suite("cpu", torch.float32, prompt=12, new_tokens=4, batch=2, model_overrides=tiny)
    assert "failed" not in table.markdown(), table.markdown()
    assert [row[:2] for row in table.rows] == [["eager", 12], ["sdpa", 12]]
    assert all(float(row[-1]) < 1e-4 for row in table.rows), table.rows


def without_inductor(monkeypatch):
    """The suites' compiles and timing replaced by Dynamo with our rewrites (or none) and one call: the code
    paths are what the CPU tests check."""
    import fa4_inductor

    def compile_without_inductor(model_fn, backend_name, **kwargs):
        chosen = fa4_inductor.fa4_inductor.rewrite_only if backend_name == "fa4_inductor" else "eager"
        return torch.compile(model_fn, backend=chosen)

    monkeypatch.setattr(bench.models, "compile_model", compile_without_inductor)
    monkeypatch.setattr(bench.timing, "median_wall_ms", lambda fn, repeats=5: fn() and 1.0 or 1.0)
    return dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=128, max_position_embeddings=256)


@pytest.mark.slow
def test_padded_suite_runs_prefill_and_training(monkeypatch):
    tiny = without_inductor(monkeypatch)
    (table,) = bench.padded_suite("cpu", torch.float32, batch=4, seqlen=16, attentions=("sdpa",), model_overrides=tiny)
    assert "failed" not in table.markdown(), table.markdown()
    assert [row[:3] for row in table.rows] == [
        ["sdpa", "prefill", kind] for kind in ("left-padded", "left-padded, static cache", "right-padded", "no mask")
    ] + [["sdpa", "train", kind] for kind in ("left-padded", "right-padded", "no mask")]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_static_cache_prefill_is_what_generate_hands_the_forward(attention):
    """The padded bench's static-cache prefill passes the mask, cache and positions that
    `generate(cache_implementation="static")` passes the forward for the same left-padded batch."""
    from helpers import tiny

    model = tiny("llama", attention).model
    model.generation_config.pad_token_id = 0
    tokens, mask = bench.padded_batch(model.config.vocab_size, 3, 7, (0, 2, 5), "cpu")
    seen = []
    forward = model.forward
    model.forward = lambda *a, **kw: seen.append(kw) or forward(*a, **kw)
    with torch.no_grad():
        model.generate(tokens, attention_mask=mask, max_new_tokens=1, do_sample=False, cache_implementation="static")
    model.forward = forward
    keyword = hf.cache_keyword(model)
    capacity = seen[0]["attention_mask"].shape[-1]
    ours = bench.padded.static_cache_prefill(model, tokens, mask, capacity)
    assert torch.equal(ours["attention_mask"], seen[0]["attention_mask"])
    assert ours["use_cache"] == seen[0]["use_cache"]
    assert type(ours[keyword]) is type(seen[0][keyword])


@pytest.mark.slow
def test_train_suite_runs_a_training_step_per_attention_code(monkeypatch):
    tiny = without_inductor(monkeypatch)
    (table,) = bench.train_suite("cpu", torch.float32, seqlen=16, model_overrides=tiny)
    assert "failed" not in table.markdown(), table.markdown()
    assert [row[:3] for row in table.rows] == [["eager", "labels", 16], ["eager", "logits mean", 16],
                                               ["sdpa", "labels", 16], ["sdpa", "logits mean", 16]]


@pytest.mark.slow  # 15 s: the fast tier's 5 minutes
def test_crossover_suite_rows_and_the_rule_they_feed():
    table = bench.crossover_suite("cpu", torch.float32, head_dims=(32, 64), heads=((1, 2, 1),), seqlens=(16, 32))
    assert [row[:4] for row in table.rows] == [[1, "2/1", 16, 32], [1, "2/1", 32, 32], [1, "2/1", 16, 64],
                                               [1, "2/1", 32, 64]]
    assert all(math.isfinite(x) and x > 0 for row in table.rows for x in row[5:9])
    assert all(row[-1] is True for row in table.rows)  # tiny: under every threshold


def test_sweep_models_select_a_part_of_the_sweep():
    assert bench.sweep_selection("256x2, bert") == dict(llama_sizes=((256, 2),), decode_sizes=((256, 2),), bert=True)
    assert bench.sweep_selection("512x4") == dict(llama_sizes=((512, 4),), decode_sizes=(), bert=False)
    assert bench.sweep_selection(None) == {}


@pytest.mark.slow
def test_int8_kv_suite_rows(monkeypatch):
    """Both caches under both backends, from a filled cache; the int8 rows' logits within the quantization's reach
    of the bfloat16 (here float32) cache's."""
    without_inductor(monkeypatch)
    tiny = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=128, max_position_embeddings=256)
    table = bench.int8_kv_suite("cpu", torch.float32, batch=2, capacity=64, steps=5, model_overrides=tiny)
    assert "failed" not in table.markdown(), table.markdown()
    assert [row[:2] for row in table.rows] == [["bf16", "default torch.compile"], ["bf16", "fa4_inductor"],
                                               ["int8", "default torch.compile"], ["int8", "fa4_inductor"]]
    differences = [float(row[-1]) for row in table.rows]
    assert differences[1] < 1e-5 and 0 < differences[2] < 0.05 and 0 < differences[3] < 0.05, differences
    model = bench.llama("sdpa", "cpu", torch.float32, **tiny)
    assert bench.int8_kv.kv_bytes_per_step(model, "int8", 2, 64) == 2 * 2 * 2 * 64 * 2 * (16 + 4)
    assert bench.int8_kv.kv_bytes_per_step(model, "bf16", 2, 64) == 2 * 2 * 2 * 64 * 2 * 16 * 2


def test_interleaved_timing_alternates_the_order_and_takes_each_median(monkeypatch):
    """A drift over the rounds must fall on both functions: each round calls both, the first one of a round
    alternating; each function's result is the median of its own timings."""
    from fa4_inductor.bench import timing

    calls = []
    drift = {"a": [5.0, 1.0, 3.0, 2.0, 100.0], "b": [10.0, 30.0, 20.0, 500.0, 40.0]}  # means 22.2 and 120
    monkeypatch.setattr(timing, "wall_ms", lambda fn: fn())

    def timed(name):
        def call():
            calls.append(name)
            return drift[name][calls.count(name) - 1]
        return call

    result = timing.interleaved_median_ms({"a": timed("a"), "b": timed("b")}, rounds=5)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]
    assert result == {"a": 3.0, "b": 30.0}


def test_per_step_timing_skips_the_warm_steps_and_freezes_the_heap(monkeypatch):
    """A decode loop's timing: every step runs in order, the warm ones before the clock starts, the timed ones with
    the objects made before them frozen (a full collection of a compile-grown heap would land in one backend's
    steps), and the heap unfrozen afterwards."""
    import gc

    from fa4_inductor.bench import timing

    clock = {"now": 0.0}
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock["now"])
    seen = []

    def step(i):
        seen.append((i, gc.get_freeze_count() > 0))
        clock["now"] += 0.001 * (100 if i < 2 else 1)  # warm steps slow (compiling), timed ones 1 ms

    assert gc.get_freeze_count() == 0
    ms = timing.per_step_ms(step, steps=6, warm=2)
    assert seen == [(0, False), (1, False), (2, True), (3, True), (4, True), (5, True)]
    assert ms == pytest.approx(1.0)
    assert gc.get_freeze_count() == 0 and gc.isenabled()


def test_families_are_their_types_default_configs_with_fewer_layers():
    families = bench.families.FAMILIES
    gemma3 = families["gemma3"].config()
    assert gemma3.layer_types == ["sliding_attention"] * 3 + ["full_attention"]
    assert (gemma3.num_hidden_layers, gemma3.head_dim, gemma3.sliding_window, gemma3.vocab_size) == (4, 256, 1024, 32000)
    gemma2 = families["gemma2"].config()
    assert gemma2.layer_types == ["sliding_attention", "full_attention"] * 2  # the default's first four
    assert (gemma2.attn_logit_softcapping, gemma2._attn_implementation) == (50.0, "eager")
    gpt2 = families["gpt2"].config(dict(hidden_size=64))
    assert (gpt2.n_layer, gpt2.n_embd, gpt2.attn_pdrop, gpt2.vocab_size) == (12, 64, 0.0, 32000)
    sliding = {name for name, family in families.items() if bench.families._sliding_cache(family.config())}
    assert sliding == {"mistral", "gemma2", "gemma3"}  # their StaticCache counts tokens in a Python int
    for family in families.values():
        config = family.config()
        tokens = [getattr(config, key, None) for key in hf.TOKEN_IDS]
        assert all(t < config.vocab_size for t in tokens if isinstance(t, int)), (family.model_type, tokens)


def test_families_selection_keeps_each_familys_cases():
    assert bench.families_selection("gemma2:prefill+train, gpt2") == [
        dict(families=("gemma2",), cases=("prefill", "train")), dict(families=("gpt2",))]
    assert bench.families_selection(None) == [{}]
    with pytest.raises(SystemExit, match="unknown"):
        bench.families_selection("gemma2:prefil")


@pytest.mark.slow
def test_families_suite_rows(monkeypatch):
    """Every case of two families (Gemma 2's eager code with its softcap and windows, GPT-2's learned positions):
    ours rewrites every layer, and its outputs are default's."""
    without_inductor(monkeypatch)
    scale = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 num_hidden_layers=2)
    (table,) = bench.families_suite("cpu", torch.float32, families=("gemma2", "gpt2"), scale=scale, seq=32,
                                    decode_steps=5, rounds=3)
    assert "failed" not in table.markdown(), table.markdown()
    assert [row[:4] for row in table.rows] == [
        [name, code, 16, "decode (no CUDA graphs)" if (name, case) == ("gemma2", "decode") else case]
        for name, code in (("gemma2", "eager"), ("gpt2", "sdpa")) for case in bench.families.CASES]
    for row in table.rows:
        on_op, as_sdpa, kept = map(int, row[-2].split(" / "))
        assert on_op >= 2 and as_sdpa == kept == 0, row
        assert float(row[-1]) < 1e-4, row


def test_families_suite_tells_the_op_from_sdpa_and_kept(monkeypatch):
    """Where ours leaves an attention to SDPA (a small attention in a host-bound graph, here forced on the CPU), the
    row does not count it as on the op."""
    from fa4_inductor.lowering import crossover

    without_inductor(monkeypatch)
    monkeypatch.setattr(crossover, "DEVICES", ("cuda", "cpu"))
    scale = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2)
    (table,) = bench.families_suite("cpu", torch.float32, families=("gpt2",), cases=("prefill",), scale=scale, seq=32,
                                    rounds=1)
    (row,) = table.rows
    on_op, as_sdpa, kept = map(int, row[-2].split(" / "))
    assert on_op == 0 and as_sdpa + kept == 2, row
