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


@pytest.fixture
def torchao_int_mm_as_on_cuda(monkeypatch):
    """torchao's int8 x int8 matmul traces a u8 x s8 `_int_mm` (x shifted by 128, then a correction by the weight's
    column sums; torchao/kernel/intmm.py) on CPUs with AVX512-VNNI and no AMX, and the s8 x s8 `_int_mm` elsewhere,
    CUDA included. Tests of the graphs CUDA gets pin the s8 x s8 path, so they do not depend on the CPU they run on."""
    intmm = pytest.importorskip("torchao.kernel.intmm")
    if hasattr(intmm, "_cpu_is_vnni_supported"):
        monkeypatch.setattr(intmm, "_cpu_is_vnni_supported", lambda: False)


@pytest.fixture
def fused_combine():
    """FA4_INDUCTOR_DECODE_FUSED_COMBINE on for one test: split decode calls of head dim 64 / 128 merge their splits
    in the main kernel's last CTA."""
    from fa4_inductor.kernels import decode, switches

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(switches.DECODE_FUSED_COMBINE, "1")
        switches.reset()
        yield lambda: decode._SPLIT_COUNTERS[("cuda", torch.cuda.current_device())]
    switches.reset()
