"""GPU tier: HF models at the head dims FA4 serves, in bfloat16, called as users call them, compiled with our backend
and with default torch.compile; `pytest -m gpu` on an sm90 / sm100 GPU.

Each model is small (2 layers) but shaped like a real one: Llama and Qwen 3 (head dim 128, 4 query heads a KV head),
Mistral (a sliding window shorter than the sequence), Gemma 2 (head dim 256, softcap, sliding and full layers; eager
code only), Phi-3 (head dim 96, no GQA), GPT-2 (head dim 64), with sequences long enough for FA4 (not the small-call
route). The rule is FlashAttention's, at the model level: against the float32 model run uncompiled, our error is at
most twice default compile's plus 1e-3 of the largest value (logits; each parameter's gradient; generate's decode
steps' logits), on every position a real token holds. Every attention layer is rewritten or routed by a crossover,
never kept for another reason.

    prefill         left-padded (what `generate` hands the model) and not, `use_cache=False`
    training step   labels, right-padded (what data collators make), loss and every gradient
    generate        a left-padded batch through a static cache with the decode step compiled (`CompileConfig`),
                    greedy: each step's logits where the tokens before it agree, and the tokens uncompiled
                    bfloat16 generate's up to its first near tie; also with torchao int8 / NVFP4 weights, as
                    torchao's tensor subclasses or as plain buffers
"""

import copy

import pytest
import torch

import fa4_inductor
from fa4_inductor import hf, publishing
from helpers import CROSSOVER_ROUTES, loss_and_gradients

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SHAPES = {  # config overrides: hidden size, heads, KV heads, head dim
    "llama": dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2, head_dim=128),
    "qwen3": dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2, head_dim=128),
    "mistral": dict(hidden_size=1024, num_attention_heads=8, num_key_value_heads=2, head_dim=128, sliding_window=384),
    "gemma2": dict(hidden_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=256, sliding_window=384),
    "phi3": dict(hidden_size=768, num_attention_heads=8, num_key_value_heads=8, head_dim=96),
    "gpt2": dict(hidden_size=512, num_attention_heads=8),  # head dim 64
}
SEQ = 1024
BATCH = 2
PAD = 300  # row 1's pad tokens


@pytest.fixture(autouse=True)
def gpu(monkeypatch):
    major, _ = torch.cuda.get_device_capability()
    if major not in (9, 10):
        pytest.skip("FA4 is wired for sm90 / sm100")
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()


def build(name: str, impl: str, **extra):
    """(bfloat16 model, float32 copy) on the GPU, in eval mode."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    reason = hf.unsupported(name, impl)
    if reason:
        pytest.skip(reason)
    config = hf.tiny_config(name, impl)
    for key, value in {**SHAPES[name], "vocab_size": 1000, "intermediate_size": 2048, "num_hidden_layers": 2,
                       "max_position_embeddings": 4096, **extra}.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=impl).cuda().eval()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model.to(torch.bfloat16), copy.deepcopy(model).float()


def batch(side: str | None, seq: int = SEQ):
    ids = torch.randint(0, 1000, (BATCH, seq), device="cuda")
    if side is None:
        return {"input_ids": ids}
    mask = torch.ones_like(ids)
    mask[1, :PAD] = 0
    return {"input_ids": ids, "attention_mask": mask if side == "left" else mask.flip(-1)}


def real_tokens(inputs) -> torch.Tensor:
    """[B, S] bool: the positions a real token holds."""
    mask = inputs.get("attention_mask")
    return torch.ones_like(inputs["input_ids"], dtype=torch.bool) if mask is None else mask.bool()


def error(got: torch.Tensor, reference: torch.Tensor) -> float:
    return (got.double() - reference.double()).abs().max().item()


def assert_fa_rule(name, ours, default, reference):
    assert ours.isfinite().all(), f"{name}: ours has non-finite values"
    ours_err, default_err = error(ours, reference), error(default, reference)
    bound = 2 * default_err + 1e-3 * reference.abs().max().item()
    assert ours_err <= bound, f"{name}: error {ours_err:.3g} against default compile's {default_err:.3g}"


def assert_served(records, layers: int):
    served = [r for r in records if r.rewritten or r.detail.startswith(CROSSOVER_ROUTES)]
    kept = [str(r) for r in records if r not in served]
    assert not kept and len(served) >= layers, kept or [str(r) for r in records]


def compiled(model, ours: bool, **kwargs):
    torch._dynamo.reset()
    return torch.compile(model, backend=fa4_inductor.backend(), **kwargs) if ours else torch.compile(model, **kwargs)


PREFILL = [(name, impl, side) for name in SHAPES for impl in ("eager", "sdpa") for side in ("left", None)
           if not (name == "gemma2" and impl == "sdpa")]


@pytest.mark.parametrize("name, impl, side", PREFILL, ids=lambda v: str(v))
def test_prefill(name, impl, side):
    model, reference_model = build(name, impl)
    inputs = {**batch(side), "use_cache": False}
    with torch.no_grad():
        reference = reference_model(**inputs).logits
        with publishing.collecting() as records:
            ours = compiled(model, True)(**inputs).logits
        default = compiled(model, False)(**inputs).logits
    real = real_tokens(inputs)
    assert_fa_rule(f"{name} {impl} logits", ours[real], default[real], reference[real])
    assert_served(records, 2)


# Gemma 2 trains unpadded: under its softcap a right-padded batch is kept as written by design (a row that sees no key
# would need eager's gradient through the tanh; test_call_modes asserts that reason), so unpadded is where its
# softcap backward runs on the op.
TRAINED = [("llama", "sdpa", "right"), ("llama", "eager", "right"), ("qwen3", "sdpa", "right"),
           ("mistral", "eager", "right"), ("gemma2", "eager", None), ("phi3", "sdpa", "right"),
           ("gpt2", "eager", "right")]


@pytest.mark.parametrize("name, impl, side", TRAINED, ids=str)
def test_training_step(name, impl, side):
    """Labels with the pad positions -100: the loss and every parameter's gradient by the rule."""
    model, reference_model = build(name, impl)
    model.train()
    reference_model.train()
    inputs = {**batch(side), "use_cache": False}
    inputs["labels"] = inputs["input_ids"].masked_fill(~real_tokens(inputs), -100)
    reference = loss_and_gradients(reference_model, reference_model, inputs)
    with publishing.collecting() as records:
        ours = loss_and_gradients(compiled(model, True), model, inputs)
    default = loss_and_gradients(compiled(model, False), model, inputs)
    for key, o, d, r in zip(["loss"] + [n for n, _ in model.named_parameters()], ours, default, reference):
        if r is not None:
            assert_fa_rule(f"{name} {impl} {key}", o, d, r)
    assert_served(records, 2)


GENERATED = [("llama", "sdpa"), ("mistral", "eager"), ("gemma2", "eager"), ("qwen3", "sdpa")]
NEW_TOKENS = 8


@pytest.mark.parametrize("name, impl", GENERATED, ids=str)
def test_static_cache_generate(name, impl):
    """`generate` over a static cache with its decode steps compiled (transformers' `CompileConfig`, CUDA graphs) by
    our backend or by default: `assert_generate_by_the_rule`."""
    model, reference_model = build(name, impl)
    records = assert_generate_by_the_rule(f"{name} {impl}", model, reference_model)
    assert_served(records, 2)


QUANTIZED = [("int8", False), ("int8", True), ("nvfp4", False), ("nvfp4", True), ("fp8", False), ("fp8", True)]


@pytest.mark.usefixtures("without_fx_graph_cache")  # conftest.py: a cache hit skips the linears' post-grad rewrites
@pytest.mark.parametrize("fmt, plain", QUANTIZED, ids=lambda v: str(v))
def test_quantized_weights_generate(fmt, plain):
    """torchao weight-only int8 and NVFP4, and fp8 weights with per-token fp8 activations, on every linear but lm_head
    (the quant bench's models), as torchao's tensor subclasses or made plain buffers (`int8.from_torchao`,
    `nvfp4.from_torchao`, `fp8.from_torchao`): generate by the rule against the float32 model with the dequantized
    weights (each read back through its linear from an identity matrix), the quantized linears and attention on the
    op."""
    pytest.importorskip("torchao")
    import torch.nn as nn
    from torchao.quantization import quantize_

    from fa4_inductor.bench import quant

    model, reference_model = build("llama", "sdpa")
    quantize_(model, quant.E2E_CONFIGS[fmt](),
              filter_fn=lambda module, fqn: isinstance(module, nn.Linear) and "lm_head" not in fqn)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear) and "lm_head" not in name:
                eye = torch.eye(module.in_features, dtype=torch.bfloat16, device="cuda")
                reference_model.get_submodule(name).weight.copy_(module(eye).T.float())
    if plain:
        quant.PLAIN[fmt][0](model)
    records = assert_generate_by_the_rule(f"{fmt} plain={plain}", model, reference_model)
    assert_served([r for r in records if r.family in ("sdpa", "handwritten")], 2)
    linears = {"int8_linear", "nvfp4_linear", "fp8_linear", "sibling_linears", "gated_linears"}
    assert any(r.rewritten and r.family in linears for r in records), [str(r) for r in records]


def assert_generate_by_the_rule(name: str, model, reference_model) -> list:
    """A left-padded batch through `generate` over a static cache, greedy, its decode steps compiled (transformers'
    `CompileConfig`, CUDA graphs) by our backend and by default. Each step's logits by the rule against the float32
    model teacher-forced on default compile's tokens (positions as generate counts them over the left padding), on the
    steps whose earlier tokens ours and default compile agree on (the first two always: the prefill is not compiled);
    our tokens uncompiled bfloat16 generate's while its top two logits stay apart by more than 1e-2 of their size (a
    near tie may flip under either compile). Returns our run's records."""
    from transformers import CompileConfig

    inputs = batch("left", seq=512)
    settings = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,  # every run as long
                    cache_implementation="static", return_dict_in_generate=True, output_logits=True, pad_token_id=0)
    with torch.no_grad():
        uncompiled = model.generate(**inputs, **settings)
        runs = {}
        for ours in (True, False):
            torch._dynamo.reset()
            backend = fa4_inductor.backend() if ours else "inductor"
            model.generation_config.compile_config = CompileConfig(backend=backend)
            with publishing.collecting() as records:
                runs[ours] = model.generate(**inputs, **settings)
            if ours:
                ours_records = records
        model.generation_config.compile_config = None
        prompt = inputs["input_ids"].shape[1]
        mask = torch.cat([inputs["attention_mask"], torch.ones_like(runs[False].sequences[:, prompt:])], dim=1)
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        teacher = reference_model(input_ids=runs[False].sequences, attention_mask=mask, position_ids=positions,
                                  use_cache=False).logits[:, prompt - 1:-1]  # [B, steps, vocab]: step t's prediction
    new = slice(prompt, None)
    same = runs[True].sequences[:, new] == runs[False].sequences[:, new]
    compared = torch.cat([torch.ones_like(same[:, :1]), same[:, :-1].cumprod(dim=1).bool()], dim=1)
    assert compared[:, :2].all()
    ours_logits, default_logits = (torch.stack(runs[o].logits, dim=1) for o in (True, False))
    assert_fa_rule(f"{name} decode logits", ours_logits[compared], default_logits[compared], teacher[compared])
    steps = torch.stack(uncompiled.logits, 1).float()  # [B, steps, vocab]
    top2 = steps.topk(2, dim=-1).values
    clear = ((top2[..., 0] - top2[..., 1]) > 1e-2 * top2[..., 0].abs()).cumprod(dim=1).bool()  # steps before a tie
    assert torch.equal(runs[True].sequences[:, new][clear], uncompiled.sequences[:, new][clear])
    return ours_records
