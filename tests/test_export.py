"""torch.export: graphs holding our ops export with dynamic sizes (the ops' fake implementations carry the symbolic
shapes), the exported program runs them, and a model exported first, then compiled with the backend, gets the
rewrite as the model itself does."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.export import Dim

import fa4_inductor
from fa4_inductor import report
from test_nvfp4_linear import random_nvfp4

ops = torch.ops.fa4


class Attention(nn.Module):
    """What a rewritten SDPA call becomes: the op on [B, H, S, D] q, k, v, its output."""

    def forward(self, q, k, v):
        return ops.attention(q, k, v, scale=q.shape[-1] ** -0.5, causal=True)[0]


class KeyMaskedAttention(nn.Module):
    def forward(self, q, k, v, key_mask):
        return ops.attention(q, k, v, None, key_mask, scale=0.25)[0]


class Int8Linear(nn.Module):
    def __init__(self, n, k):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.register_buffer("w", torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g))
        self.register_buffer("scale", torch.rand(n, generator=g) / 64 + 1e-3)

    def forward(self, x):
        return ops.int8_linear(x, self.w, self.scale)


class Int8Int8Linear(Int8Linear):
    def forward(self, x_int8, x_scale):
        return ops.int8_int8_linear(x_int8, x_scale, self.w, self.scale, out_dtype=torch.bfloat16)


class NVFP4Linear(nn.Module):
    def __init__(self, n, k):
        super().__init__()
        for name, t in zip(("w_fp4", "block", "global_scale"), random_nvfp4(n, k, seed=2)):
            self.register_buffer(name, t)

    def forward(self, x):
        return ops.nvfp4_linear(x, self.w_fp4, self.block, self.global_scale)


def export_and_check(module, args, dynamic_shapes, fresh_args):
    """Exports with `dynamic_shapes`, then runs the program on `fresh_args` (other sizes on the dynamic dims):
    bit for bit the module's eager output. Returns the exported program."""
    program = torch.export.export(module, tuple(args), dynamic_shapes=dynamic_shapes)
    torch.testing.assert_close(program.module()(*fresh_args), module(*fresh_args), rtol=0, atol=0)
    return program


def calls(program, op) -> int:
    return sum(node.target is op for node in program.graph.nodes)


def test_attention_exports_with_dynamic_batch_and_length():
    b, s = Dim("batch", min=1, max=64), Dim("seq", min=2, max=4096)
    shapes = ({0: b, 2: s}, {0: b, 2: s}, {0: b, 2: s})
    args = [torch.randn(2, 4, 16, 32) for _ in range(3)]
    fresh = [torch.randn(3, 4, 40, 32) for _ in range(3)]
    program = export_and_check(Attention(), args, shapes, fresh)
    assert calls(program, ops.attention.default) == 1
    out = next(n for n in program.graph.nodes if n.target is ops.attention.default).meta["val"][0]
    assert [isinstance(d, torch.SymInt) for d in out.shape] == [True, False, True, False], out.shape


def test_attention_with_a_key_mask_exports_with_dynamic_keys():
    sk = Dim("keys", min=2, max=4096)
    args = (torch.randn(2, 4, 3, 16), torch.randn(2, 2, 10, 16), torch.randn(2, 2, 10, 16),
            torch.rand(2, 10) > 0.3)
    fresh = (torch.randn(2, 4, 3, 16), torch.randn(2, 2, 25, 16), torch.randn(2, 2, 25, 16), torch.rand(2, 25) > 0.3)
    fresh[3][:, 0] = True
    program = export_and_check(KeyMaskedAttention(), args, (None, {2: sk}, {2: sk}, {1: sk}), fresh)
    assert calls(program, ops.attention.default) == 1


@pytest.mark.parametrize("module, make_args", [
    (Int8Linear(24, 64), lambda m: (torch.randn(m, 64, dtype=torch.bfloat16),)),
    (NVFP4Linear(24, 64), lambda m: (torch.randn(m, 64, dtype=torch.bfloat16),)),
    (Int8Int8Linear(24, 64), lambda m: (torch.randint(-127, 128, (m, 64), dtype=torch.int8), torch.rand(m, 1) / 100)),
], ids=["int8_linear", "nvfp4_linear", "int8_int8_linear"])
def test_quantized_linears_export_with_dynamic_rows(module, make_args):
    rows = Dim("rows", min=1, max=8192)
    args = make_args(5)
    program = export_and_check(module, args, tuple({0: rows} for _ in args), make_args(17))
    assert sum(node.op == "call_function" and str(node.target).startswith("fa4.") for node in program.graph.nodes) == 1


class CausalSelfAttention(nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, d))


def test_an_exported_model_compiled_with_the_backend_gets_the_rewrite():
    torch.manual_seed(0)
    model = CausalSelfAttention().eval()
    x = torch.randn(2, 24, 64)
    program = torch.export.export(model, (x,), dynamic_shapes=({1: Dim("seq", min=2, max=2048)},))
    fresh = torch.randn(2, 40, 64)
    torch._dynamo.reset()
    with report.collecting() as records, torch.no_grad():
        out = torch.compile(program.module(), backend=fa4_inductor.fa4_inductor)(fresh)
        expected = model.double()(fresh.double())
    assert [r.rewritten for r in records] == [True], [str(r) for r in records]
    torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_an_exported_hf_model_hands_the_op_its_mask_per_query_row():
    """An HF decoder exported, then compiled: its causal mask is built of aten ops (expand, ...), which the mask
    proofs (written for Dynamo's torch-level graphs) do not read yet; with `run_time_masks` (on by default) every
    layer reaches the op with that boolean mask as its key mask per query row (read on the host on CUDA: a causal
    prefix, FA4), and the logits are eager's. With the option off, every layer is kept as written, with the reason."""
    pytest.importorskip("transformers")
    from fa4_inductor import hf

    if hf.transformers_major() < 5:
        pytest.skip("transformers 4.57's exported mask keeps its vmap, which torch.compile cannot trace again (any "
                    "backend)")
    torch.manual_seed(0)
    model = hf.build("llama", "sdpa").model.eval()
    ids = torch.randint(3, model.config.vocab_size, (2, 12))
    program = torch.export.export(model, (ids,), kwargs={"use_cache": False})
    with torch.no_grad():
        expected = model(ids, use_cache=False)
    for backend, rewritten, detail in ((fa4_inductor.fa4_inductor, True, "key_mask=mask per query row"),
                                       (fa4_inductor.backend(run_time_masks=False), False,
                                        "mask not recognized: the mask is built by expand.default")):
        torch._dynamo.reset()
        with report.collecting() as records, torch.no_grad():
            out = torch.compile(program.module(), backend=backend)(ids, use_cache=False)
        assert len(records) == model.config.num_hidden_layers
        assert all(r.rewritten == rewritten and detail in r.detail for r in records), [str(r) for r in records]
        torch.testing.assert_close(out.logits, expected.logits)
