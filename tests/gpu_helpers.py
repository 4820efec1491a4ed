"""Helpers shared by the GPU-tier test modules: PyTorch's own attention, the FA rule, CUDA-graph capture, and the
setup of the decode kernels' tests (test_gpu_decode.py, test_gpu_decode_int8kv.py)."""

import pytest
import torch

from fa4_inductor.kernels import reference


def eager(q, k, v, seqused_k=None, key_mask=None, *, scale, causal, window_left, window_right, softcap):
    """The attention as plain PyTorch ops in q's dtype: (out, lse)."""
    keep = reference.allowed_keys(q.shape[2], k.shape[2], causal=causal, window_left=window_left,
                                  window_right=window_right, seqused_k=seqused_k, device=q.device,
                                  key_mask=reference.visible_keys(key_mask))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = q @ k.transpose(-1, -2) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if reference.is_additive(key_mask):  # eager code's `scores + mask`
        s = s + reference.key_mask_rows(key_mask)[:, 0]
    if keep is not None:
        s = s.masked_fill(~keep.squeeze(2), float("-inf"))
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v, torch.logsumexp(s, dim=-1)


def assert_fa_rule(name, ours, ref, pt, softcap=0.0, grad=False):
    assert ours.isfinite().all(), f"{name} has non-finite values"
    rtol, atol = (3.0, 1e-5 + (3e-4 if grad else 0.0)) if softcap else (2.0, 1e-5)
    err = (ours.double() - ref).abs().max().item()
    pt_err = (pt.double() - ref).abs().max().item()
    assert err <= rtol * pt_err + atol, f"{name}: error {err:.3g} > {rtol} x PyTorch's {pt_err:.3g} + {atol:.0e}"


def assert_fa_rule_with_gradients(out, dout, leaves, fn, names):
    """`out`, computed by ours from `leaves`, and its gradients for `dout` (named `names`), by the FA rule against
    `fn` on the leaves in float64, PyTorch's own error being `fn`'s in the leaves' dtype."""
    grads = torch.autograd.grad(out, leaves, dout)
    exact = [t.detach().double().requires_grad_() for t in leaves]
    out64 = fn(*exact)
    refs = torch.autograd.grad(out64, exact, dout.double())
    plain = [t.detach().requires_grad_() for t in leaves]
    pt_out = fn(*plain)
    assert_fa_rule("out", out, out64.detach(), pt_out)
    for name, g, r, p in zip(names, grads, refs, torch.autograd.grad(pt_out, plain, dout)):
        assert_fa_rule(name, g, r, p, grad=True)


def capture(step):
    """(graph, static outputs) of `step` captured in a CUDA graph on a side stream, after one warm-up
    run on that stream (as torch.compile's CUDA graphs do)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        static = step()
    return graph, static


def replays(step, inputs, used, fresh_inputs, lengths):
    """`step` (returning out, lse) captured once (`capture`), then replayed once per entry of `lengths`: before each
    replay `fresh_inputs()` is copied into the tensors `inputs` and the entry into `used` (seqused_k); each replay
    must equal a fresh call of `step` bit for bit (the kernels use no atomics). Yields (entry, static out, static
    lse) after each replay, for the caller's reference check."""
    graph, (static_out, static_lse) = capture(step)
    for entry in lengths:
        for t, fresh in zip(inputs, fresh_inputs()):
            t.copy_(fresh)
        used.copy_(torch.tensor(entry))
        graph.replay()
        torch.cuda.synchronize()
        out, lse = step()
        torch.testing.assert_close(static_out, out, rtol=0, atol=0)
        torch.testing.assert_close(static_lse, lse, rtol=0, atol=0)
        yield entry, static_out, static_lse


def sm90_decode_setup(monkeypatch, *unset):
    """What each decode-kernel test starts from: skipped unless the GPU is sm90 (the kernels are built for it), the
    environment variables `unset` removed (a test that wants one sets it), torch seeded with 0."""
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        pytest.skip(f"the decode kernel is built for sm90, not sm{major}{minor}")
    for name in unset:
        monkeypatch.delenv(name, raising=False)
    torch.manual_seed(0)


def flags(d, causal=False, softcap=0.0, scale=None):
    """The attention flags of a call with head dim d: scale d ** -0.5 unless given, no window."""
    return dict(scale=d ** -0.5 if scale is None else scale, causal=causal, window_left=-1, window_right=-1,
                softcap=softcap)


def additive_key_mask(b, sk, dtype, seed=0):
    """A [b, sk] additive key mask in `dtype` on the GPU, as eager attention code adds it: random finite values,
    finfo.min on padded keys (left, right, holes) and on every key but the last of the last sequence."""
    g = torch.Generator().manual_seed(seed)
    hidden = ~padding_key_mask(b, sk, seed).cpu()
    hidden[-1, -1] = False
    mask = (torch.randn(b, sk, generator=g) * 2).masked_fill(hidden, torch.finfo(dtype).min)
    return mask.to(dtype).cuda()


def padding_key_mask(b, sk, seed=0):
    """A [b, sk] bool key mask on the GPU: left padding, right padding, holes and a sequence whose keys are all
    hidden."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, sk, generator=g) > 0.2
    mask[0, : sk // 3] = False
    mask[1, sk // 2:] = False
    mask[-1] = False
    return mask.cuda()


def assert_within_pytorch_error(name, ours, reference, pytorch):
    """ours's max error against the float64 reference is at most 2x PyTorch's own + 1e-5 of the scale."""
    assert ours.isfinite().all(), f"{name} has non-finite values"
    err = (ours.double() - reference).abs().max().item()
    pt_err = (pytorch.double() - reference).abs().max().item()
    atol = 1e-5 * reference.abs().max().item()
    assert err <= 2 * pt_err + atol, f"{name}: error {err:.3g} > 2 x PyTorch's {pt_err:.3g} + {atol:.1e}"
