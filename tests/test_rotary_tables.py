"""Rotary tables computed once (`lowering/rotary_tables.py`, `fa4::computed_once`): which values the pass marks, the
op's checks, and that Inductor's code evaluates each table's cos / sin once, forward and backward, with the model's
outputs and gradients those of float64 eager code."""

from __future__ import annotations

import re

import pytest
import torch
from torch._inductor.utils import run_and_get_code

import fa4_inductor
from fa4_inductor.kernels import COMPUTED_ONCE
from fa4_inductor.lowering import rotary_tables

from helpers import compile_and_record, recording_compile, tiny


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rotary(torch.nn.Module):
    """HF's rotary embedding and its application to q and k, in `layers` layers (q and k: [B, H, S, D])."""

    def __init__(self, dim=16, layers=2, scaling=1.0, dtype=torch.float32):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim)), persistent=False)
        self.layers, self.scaling, self.dtype = layers, scaling, dtype

    def forward(self, q, k):
        positions = torch.arange(q.shape[2], device=q.device)[None].float()
        freqs = (self.inv_freq[None, :, None] @ positions[:, None, :]).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.scaling).to(self.dtype)
        sin = (emb.sin() * self.scaling).to(self.dtype)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        for _ in range(self.layers):
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        return q, k


def qk(seq=256, seed=0):
    """q and k of `seq` positions: the tables are [1, seq, 16] (computed once from rotary_tables.MIN_ELEMENTS on)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 4, seq, 16, generator=g), torch.randn(2, 2, seq, 16, generator=g)


def test_opcheck():
    torch.library.opcheck(COMPUTED_ONCE, (torch.randn(3, 5, requires_grad=True),))


def test_each_table_read_by_several_consumers_is_computed_once():
    recorder, _ = compile_and_record(Rotary(scaling=0.5, dtype=torch.bfloat16), *qk())
    assert recorder.count("fa4::computed_once") == 2
    nodes = [n for n in recorder.graphs[0].graph.nodes if n.target is COMPUTED_ONCE]
    assert [n.args[0].target for n in nodes] == ["to", "to"]  # the chain's end: cos * 0.5, then the cast
    assert [n.args[0].args[0].args[0].target for n in nodes] == ["cos", "sin"]


def test_a_small_table_one_consumer_or_a_tensor_operand_stays_inlined():
    def one_consumer(q):
        cos = torch.arange(q.shape[-1], dtype=q.dtype).cos()
        return q * cos

    def times_a_tensor(q, k):  # cos * k is no table of cos alone; k's consumers are q and the output
        t = torch.arange(q.shape[-1], dtype=q.dtype).cos() * k
        return q * t.sin(), t

    recorder, _ = compile_and_record(one_consumer, qk()[0])
    assert recorder.count("fa4::computed_once") == 0
    q = qk()[0]
    recorder, _ = compile_and_record(times_a_tensor, q, q.flip(0))
    assert recorder.count("fa4::computed_once") == 0
    recorder, _ = compile_and_record(Rotary(), *qk(seq=rotary_tables.MIN_ELEMENTS // 16 - 1))  # a decode-sized table
    assert recorder.count("fa4::computed_once") == 0


def test_symbolic_sizes_are_decided_for_the_sizes_compiled():
    recorder, compiled = recording_compile(Rotary(), dynamic=True)
    compiled(*qk())
    compiled(*qk(seq=300))  # the same graph
    assert len(recorder.graphs) == 1 and recorder.count("fa4::computed_once") == 2


def test_the_option_turns_it_off():
    recorder, _ = compile_and_record(Rotary(), *qk(), rotary_tables=False)
    assert recorder.count("fa4::computed_once") == 0


def trigonometric_calls(code: str) -> int:
    return len(re.findall(r"\b(?:std::)?(?:cos|sin)\(", code))


CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                         reason="needs a CUDA GPU")])


@pytest.mark.parametrize("device", [pytest.param("cpu", marks=pytest.mark.slow), CUDA])  # 11 s on the CPU
@pytest.mark.parametrize("option", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["on", "off"])  # off: the
# control that the trigonometric count can tell the two apart (8 s on the CPU: the slow tier)
def test_inductor_evaluates_the_tables_once_and_the_gradients_are_eagers(option, device):
    """A training step of a tiny Llama (sdpa code) under the backend: Inductor's backward evaluates no cos / sin when
    the tables are computed once (off, it recomputes them); outputs and gradients match float64 eager code."""
    model = tiny("llama", "sdpa").model.train().to(device)
    ids = torch.randint(0, model.config.vocab_size, (2, 256), generator=torch.Generator().manual_seed(1)).to(device)
    reference = tiny("llama", "sdpa").model.train().double().to(device)
    reference.load_state_dict(model.state_dict())
    expected = reference(ids, use_cache=False).logits
    expected.sum().backward()

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=fa4_inductor.backend(rotary_tables=option))

    def step():
        out = compiled(ids, use_cache=False).logits
        out.sum().backward()
        return out

    out, (forward, backward) = run_and_get_code(step)
    assert (trigonometric_calls(backward) == 0) == option
    assert trigonometric_calls(forward) > 0
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=2e-5)
    for (name, p), ref in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad.double(), ref.grad, atol=1e-4, rtol=1e-4, msg=name)
