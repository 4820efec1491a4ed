"""Launch replay for the FA4 adapter (`kernels/fa4_replay.py`), against a stand-in for FA4's Python entry point.

The stand-in behaves like `_flash_attn_fwd`: it builds a key, compiles into `compile_cache` on a
miss, then launches the compiled function with the caller's tensors (a real launch dispatches no
torch op, so the stand-in's "kernel" only notes its arguments)."""

import pytest
import torch

from fa4_inductor.kernels import fa4_replay, switches


class FakeFA4:
    def __init__(self, extra=None):
        self.launched = []
        self.compiles = 0
        self.extra = extra
        fake = self

        def _flash_attn_fwd(q, k, v, out, lse, scale):
            key = (q.shape, q.dtype)
            if key not in _flash_attn_fwd.compile_cache:
                fake.compiles += 1
                _flash_attn_fwd.compile_cache[key] = lambda *args: fake.launched.append(args)
            if fake.extra == "own_op":
                out.zero_()
            temp = torch.empty(4) if fake.extra == "temporary" else None
            _flash_attn_fwd.compile_cache[key](q.detach(), k, v, out, lse, scale, None, temp)

        _flash_attn_fwd.compile_cache = {}
        self._flash_attn_fwd = _flash_attn_fwd


def tensors():
    q, k, v = (torch.randn(2, 8, 4, 16) for _ in range(3))
    return q, k, v, torch.empty(2, 8, 4, 16), torch.empty(2, 4, 8), None


def launch(fa, ts, scale=0.25):
    fa4_replay.launch_forward(fa, ts, (scale,), lambda: fa._flash_attn_fwd(*ts[:5], scale))


@pytest.fixture(autouse=True)
def fresh_launches(monkeypatch):
    monkeypatch.setattr(fa4_replay, "_LAUNCHES", type(fa4_replay._LAUNCHES)())
    monkeypatch.delenv(fa4_replay.NO_REPLAY_ENV, raising=False)


def test_replay_launches_the_recorded_kernel_with_new_tensors():
    fa = FakeFA4()
    launch(fa, tensors())  # compiles: decided on a later call
    launch(fa, tensors())  # records
    assert len(fa4_replay._LAUNCHES) == 1 and fa.compiles == 1
    fa._flash_attn_fwd.compile_cache.clear()  # a replay never goes through the entry point again
    third = tensors()
    launch(fa, third)
    assert len(fa.launched) == 3
    args = fa.launched[-1]
    assert all(a is t for a, t in zip(args[:5], third[:5])) and args[5:] == (0.25, None, None)


def test_a_new_signature_is_recorded_separately():
    fa = FakeFA4()
    for scale in (0.25, 0.25, 0.5, 0.5):
        launch(fa, tensors(), scale)
    assert len(fa4_replay._LAUNCHES) == 2


@pytest.mark.parametrize("extra, why", [("own_op", "torch ops of its own"), ("temporary", "a tensor FA4 made")])
def test_calls_that_do_more_than_one_launch_are_never_replayed(extra, why):
    fa = FakeFA4(extra)
    for _ in range(3):
        launch(fa, tensors())
    (decision,) = fa4_replay._LAUNCHES.values()
    assert decision is None
    assert len(fa.launched) == 3  # every call went through the entry point
    launch_fn, reason = fa4_replay._as_replay(_recording_of(fa), tensors())
    assert launch_fn is None and why in reason


def _recording_of(fa):
    recorder = fa4_replay._Recorder(fa._flash_attn_fwd.compile_cache)
    fa._flash_attn_fwd.compile_cache = recorder
    ts = tensors()
    with recorder:
        fa._flash_attn_fwd(*ts[:5], 0.25)
    fa._flash_attn_fwd.compile_cache = recorder.cache
    return recorder


def test_no_replay_env(monkeypatch):
    monkeypatch.setenv(fa4_replay.NO_REPLAY_ENV, "1")
    switches.reset()
    fa = FakeFA4()
    for _ in range(3):
        launch(fa, tensors())
    assert not fa4_replay._LAUNCHES and len(fa.launched) == 3
