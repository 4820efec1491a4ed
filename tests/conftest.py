import pytest
import torch

from fa4_inductor.kernels import switches


@pytest.fixture(autouse=True)
def fresh_switches():
    """The kernels read the environment once (`switches.current()`): each test reads it afresh, after
    its fixtures set variables, and leaves no state behind. A test that sets one mid-way calls
    `switches.reset()` after it."""
    switches.reset()
    yield
    switches.reset()


@pytest.fixture
def without_fx_graph_cache(tmp_path, monkeypatch):
    """A cache hit skips the post-grad passes (lowering/post_grad.py): a test that watches them starts from an
    empty cache of its own and turns the FX graph and AOTAutograd caches off."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    with torch._inductor.config.patch(fx_graph_cache=False, fx_graph_remote_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        yield
