"""Compile-only tier for the split-KV decode kernel: CuTe DSL compiles it for sm_90a on a CPU.

Also the host-side rules that need no GPU: the split count is a function of shapes only and stays
in range, and the dispatch declines what the kernel cannot take. Numerics are in
`test_gpu_decode.py` (GPU tier).
"""

import os
import subprocess
import sys

import pytest
import torch

from fa4_inductor.kernels import decode, switches

ARCH = "sm_90a"


@pytest.fixture(scope="module")
def cute_dsl():
    """Import cutlass (~3 s) only for this module, targeting Hopper without a GPU."""
    os.environ.setdefault("CUTE_DSL_ARCH", ARCH)
    pytest.importorskip("cutlass")
    pytest.importorskip("tvm_ffi", reason="the decode kernel compiles with --enable-tvm-ffi")


# A representative few: each main-kernel feature (both dtypes, head dims 64 / 96 / 128 / 256, GQA 1 to
# 16, causal, softcap, seqused_k, split and one-split epilogues) appears at least once.
MAIN_VARIANTS = [
    # dtype, head_dim, group, causal, softcap, seqused, split
    (torch.bfloat16, 128, 4, False, False, False, True),
    (torch.float16, 64, 8, True, True, False, True),
    (torch.bfloat16, 128, 16, True, False, True, False),
    (torch.bfloat16, 256, 1, True, False, True, True),
    (torch.bfloat16, 96, 1, True, False, True, True),  # Phi-3's head dim: 8 x 32 swizzle atoms
    (torch.float16, 96, 4, False, True, False, False),
]
KEY_MASK_VARIANTS = [(torch.bfloat16, 128, 4, True, False, True, True), (torch.float16, 64, 8, True, True, True, False)]


@pytest.mark.slow
@pytest.mark.parametrize("variant", MAIN_VARIANTS, ids=lambda v: "-".join(map(str, v)).replace("torch.", ""))
def test_main_kernel_compiles(cute_dsl, variant):
    key = decode._Key("main", *variant, ARCH, stages=decode.stages_for(variant[1]))
    assert callable(decode.compiled(key))
    assert decode.compiled(key) is decode.compiled(key)  # the explicit cache holds it


@pytest.mark.slow
@pytest.mark.parametrize("additive", [False, True], ids=["boolean", "additive"])
@pytest.mark.parametrize("variant", KEY_MASK_VARIANTS, ids=lambda v: "-".join(map(str, v)).replace("torch.", ""))
def test_main_kernel_with_a_key_mask_compiles(cute_dsl, variant, additive):
    key = decode._Key("main", *variant, ARCH, stages=decode.stages_for(variant[1]), key_mask=True,
                      additive_mask=additive)
    assert callable(decode.compiled(key))


@pytest.mark.parametrize(
    "dtype, head_dim, group, pdl",
    [(torch.bfloat16, 128, 4, True), (torch.float16, 64, 8, False), (torch.bfloat16, 256, 16, True),
     (torch.bfloat16, 96, 1, True)])
@pytest.mark.slow
def test_combine_kernel_compiles(cute_dsl, dtype, head_dim, group, pdl):
    key = decode._Key("combine", dtype, head_dim, group, False, False, False, True, ARCH, pdl)
    assert callable(decode.compiled(key))


@pytest.mark.slow  # ~8 s of CuTe compiles; the fast tier compiles single variants above
def test_warmup_compiles_every_variant_of_a_shape(cute_dsl):
    decode.warmup(torch.float16, 128, 2, q_len=1, device="cpu", causal=True, seqused_k=True)
    assert decode.warmup(torch.float16, 128, 2, q_len=1, device="cpu", causal=True, seqused_k=True) == 0
    with pytest.raises(ValueError):
        decode.warmup(torch.float16, 80, 2)


SHAPES = [
    # batch, kv_heads, q_len, group, seqlen_k, head_dim
    (1, 8, 1, 4, 32768, 128),
    (8, 8, 1, 4, 32768, 128),
    (64, 8, 1, 4, 32768, 128),
    (1, 8, 1, 4, 4096, 128),
    (1, 8, 8, 16, 4096, 128),
    (1, 1, 1, 1, 17, 64),
    (2, 4, 4, 8, 1000, 256),
    (1, 2, 1, 4, 0, 128),
]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_num_splits_is_in_range(shape):
    batch, kv_heads, q_len, group, seqlen_k, head_dim = shape
    n = decode.num_splits(batch, kv_heads, q_len, group, seqlen_k, head_dim, num_sms=132)
    assert 1 <= n <= decode.MAX_SPLITS
    tiles = -(-seqlen_k // decode.TILE_N)
    assert n == 1 or tiles // n >= decode.MIN_TILES_PER_SPLIT
    ctas = batch * kv_heads * decode.row_tiles(q_len, group)
    assert n == 1 or ctas * n <= 1.5 * 132


def test_num_splits_targets():
    """The H200 decode shapes of issue 5 (hq32 hkv8 d128): b1 spreads over the GPU, b64 does not split."""
    assert decode.num_splits(1, 8, 1, 4, 32768, 128, 132) == 16  # one wave, one CTA per SM (measured best)
    assert decode.num_splits(8, 8, 1, 4, 32768, 128, 132) == 2
    assert decode.num_splits(64, 8, 1, 4, 32768, 128, 132) == 1


def test_host_mirrors_the_kernel_tiling(cute_dsl):
    from fa4_inductor.kernels.cute import decode_attention, decode_combine

    assert (decode.TILE_M, decode.TILE_N, decode.NUM_WARPS) == (
        decode_attention.TILE_M, decode_attention.TILE_N, decode_attention.NUM_WARPS)
    assert decode.MAX_SPLITS == decode_combine.MAX_SPLITS


@pytest.mark.parametrize("d", [64, 96, 128, 256])
def test_merge_spread_stays_in_the_row_and_reads_without_bank_conflicts(cute_dsl, d):
    """`_spread` permutes each row's d columns of the fp32 merge buffer (at 96 too, whose columns past 64 a 64-wide
    XOR would push out of the row), and the merge's reads (thread t: row t // 8, columns t % 8 + 8 j) hit 32 distinct
    banks a warp."""
    from fa4_inductor.kernels.cute.decode_attention import NUM_WARPS, TILE_M, _spread

    for row in range(TILE_M):
        assert sorted(_spread(row, col, d) for col in range(d)) == list(range(d))
    for warp in range(NUM_WARPS):
        for j in range(d // 8):
            threads = [32 * warp + lane for lane in range(32)]
            banks = {((t // 8) * d + _spread(t // 8, t % 8 + 8 * j, d)) % 32 for t in threads}
            assert len(banks) == 32, (warp, j)


def test_stages_fit_shared_memory(monkeypatch):
    for d in decode.HEAD_DIMS:
        assert decode.stages_for(d) >= 2
    monkeypatch.setenv(decode.SMEM_KB_ENV, "72")  # the tuning knob
    switches.reset()
    assert decode.stages_for(128) == 2
    monkeypatch.setenv(decode.SMEM_KB_ENV, "160")
    switches.reset()
    assert decode.stages_for(128) == 4


def test_declines_off_gpu(monkeypatch):
    q, k = torch.randn(1, 32, 1, 128), torch.randn(1, 8, 4096, 128)
    reason = decode.dispatch_reason(q, k, k, scale=0.1)
    assert reason is not None and "CUDA" in reason


def test_disable_env(monkeypatch):
    monkeypatch.setenv(decode.DISABLE_ENV, "1")
    switches.reset()
    q, k = torch.randn(1, 32, 1, 128), torch.randn(1, 8, 4096, 128)
    assert decode.DISABLE_ENV in decode.unsupported_reason(q, k, k, scale=0.1)


@pytest.mark.slow
def test_host_module_imports_no_cutlass():
    """`kernel_for` imports `decode` on every CUDA call: it must not pay cutlass's ~3 s import."""
    code = "import sys, fa4_inductor.kernels.decode; assert 'cutlass' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("sq, group, sk, why", [
    (1, 4, 4096, "runs on CUDA"),  # decode-shaped: only the device stops it here
    (4, 4, 4096, "runs on CUDA"),
    (8, 4, 4096, "Sq * group = 32"),  # two row tiles would read each KV tile twice: FA4's job
    (1, 32, 4096, "Sq * group = 32"),
    (1, 4, decode.DISPATCH_MIN_SEQLEN_K - 1, "Sk ="),
])
def test_dispatch_takes_decode_shaped_calls(sq, group, sk, why):
    q = torch.randn(1, group, sq, 128, dtype=torch.bfloat16)
    k = torch.randn(1, 1, sk, 128, dtype=torch.bfloat16)
    assert why in decode.dispatch_reason(q, k, k, scale=0.1)


def test_prepare_normalises_a_call(monkeypatch):
    """`prepare`, the host half shared by the bf16 and int8-KV decode kernels: lengths as int32, the mask as
    bytes, q with a unit stride on D, the kernels' scalars, the split count as asked (capped)."""
    import math

    from fa4_inductor.kernels.flags import Flags

    q = torch.randn(2, 3, 64, 16).transpose(2, 3)  # [B, Hq, Sq, D] with stride 16 on D
    k = torch.randn(2, 1, 40, 64)
    mask = torch.rand(2, 40) > 0.5
    call = decode.prepare(q, k, torch.tensor([5, 40]), mask, 3, Flags(scale=0.5, causal=True))
    assert call.q.stride(-1) == 1 and torch.equal(call.q, q)
    assert call.seqused_k.dtype == torch.int32 and call.key_mask.dtype == torch.uint8
    assert call.splits == 3 and call.causal and call.scalars == (0.5 * math.log2(math.e), 0.0, 0.0)
    assert call.out.shape == (2, 3, 16, 64) and call.lse.shape == (2, 3, 16)
    additive = decode.prepare(q, k, None, torch.randn(2, 40).masked_fill(mask, 0.0)[:, ::1], 3, Flags(scale=0.5))
    assert additive.key_mask.dtype == torch.float32 and additive.key_mask.stride(-1) == 1
    monkeypatch.setattr(decode.compile_utils, "target_arch", lambda device: ARCH)  # no GPU to ask
    assert decode._keys(q, k, None, additive.key_mask, False, 0.0, True)[0].additive_mask
    assert not decode._keys(q, k, None, call.key_mask, False, 0.0, True)[0].additive_mask
    capped = decode.prepare(q, k, None, None, 1000, Flags(scale=0.5, softcap=30.0))
    assert capped.splits == decode.MAX_SPLITS and capped.scalars == (0.0, 0.5 / 30.0, 30.0 * math.log2(math.e))
    with pytest.raises(ValueError):
        decode.prepare(q, k, torch.tensor([5]), None, 1, Flags(scale=0.5))


@pytest.fixture
def fused_combine_on(monkeypatch):
    monkeypatch.setenv(switches.DECODE_FUSED_COMBINE, "1")
    switches.reset()
    monkeypatch.setattr(decode, "_SPLIT_COUNTERS", {})
    yield
    monkeypatch.delenv(switches.DECODE_FUSED_COMBINE, raising=False)
    switches.reset()


def test_split_counters_follow_the_switch_and_outlive_their_graphs(fused_combine_on, monkeypatch):
    """FA4_INDUCTOR_DECODE_FUSED_COMBINE: a split call of head dim 64 or 128 gets the device's zeroed int32 counters
    (a batch row and row tile each), reused while large enough and grown, never freed (a CUDA graph keeps the one it
    captured), not made while a graph is being captured (the combine kernel runs then); one split, head dim 256
    (its registers spill) or the switch off: none."""
    from fa4_inductor.kernels.flags import Flags

    def call(b, hq, sq, d, splits, hkv=2):
        q = torch.randn(b, hq, sq, d)
        return decode.prepare(q, torch.randn(b, hkv, 64, d), None, None, splits, Flags(scale=0.5))

    first = decode.split_counters(call(2, 8, 1, 128, 4), 2)
    assert first.dtype == torch.int32 and first.numel() >= 2 * 2 and not first.any()
    assert decode.split_counters(call(3, 8, 1, 64, 7), 2) is first
    assert decode.split_counters(call(2, 8, 1, 128, 1), 2) is None
    assert decode.split_counters(call(2, 8, 1, 256, 4), 2) is None
    monkeypatch.setattr(decode, "capturing", lambda device: True)
    assert decode.split_counters(call(2, 8, 1, 128, 4), 2) is first  # large enough: also while capturing
    big = call(2, 32, 8, 128, 4)
    monkeypatch.setattr(decode, "row_tiles", lambda sq, group: 2048)  # more than the first buffer holds
    assert decode.split_counters(big, 2) is None
    monkeypatch.setattr(decode, "capturing", lambda device: False)
    grown = decode.split_counters(big, 2)
    assert grown.numel() >= 2 * 2 * 2048 and decode._SPLIT_COUNTERS[("cpu", None)] == [first, grown]
    monkeypatch.delenv(switches.DECODE_FUSED_COMBINE)
    switches.reset()
    assert decode.split_counters(call(2, 8, 1, 128, 4), 2) is None


def test_fused_combine_keys_and_warmup_choices(fused_combine_on, monkeypatch):
    """Its main-kernel variants: split only, head dims 64 and 128; warmup compiles them beside the others."""
    monkeypatch.setattr(decode.compile_utils, "target_arch", lambda device: ARCH)
    q, k = torch.randn(1, 8, 1, 128), torch.randn(1, 2, 64, 128)
    assert decode._keys(q, k, None, None, False, 0.0, True, True)[0].fused_combine
    assert not decode._keys(q, k, None, None, False, 0.0, True)[0].fused_combine
    assert decode.fused_combine_choices(True, 128) == (False, True) and decode.fused_combine_choices(True, 64)[1]
    assert decode.fused_combine_choices(False, 128) == (False,) and decode.fused_combine_choices(True, 256) == (False,)


@pytest.mark.slow
@pytest.mark.parametrize("variant", [(torch.bfloat16, 128, 4, True, False, True, True),
                                     (torch.float16, 64, 8, False, True, False, True)],
                         ids=lambda v: "-".join(map(str, v)).replace("torch.", ""))
def test_fused_combine_compiles(cute_dsl, variant):
    """The main kernel with the fused combine (`combine_if_last`: an atomic count, the last CTA merging the splits)."""
    key = decode._Key("main", *variant, ARCH, stages=decode.stages_for(variant[1]), fused_combine=True)
    assert callable(decode.compiled(key))


def test_launch_gives_the_fused_main_kernel_the_outputs_and_counters(monkeypatch):
    """`launch` with counters: the main kernel gets out, lse, the partials and the counters, and no combine kernel
    runs; without them it gets the partials only and the combine merges them; one split, out and lse only."""
    from fa4_inductor.kernels.flags import Flags

    q, k, v = torch.randn(2, 8, 1, 64), torch.randn(2, 2, 96, 64), torch.randn(2, 2, 96, 64)
    seen, combined = [], []
    monkeypatch.setattr(decode, "compiled", lambda key: lambda *args: combined.append(key))

    def main(*args):
        seen.append(args)

    counters = torch.zeros(16, dtype=torch.int32)
    split = decode.prepare(q, k, None, None, 3, Flags(scale=0.5))
    decode.launch(split, main, (k, v), "combine", counters)
    out, lse, o_part, lse_part, given = seen[-1][5:10]
    assert out is split.out and lse is split.lse and given is counters and not combined
    assert o_part.shape == (2, 2, 3, decode.TILE_M, 64) and lse_part.shape == (2, 2, 3, decode.TILE_M)
    decode.launch(split, main, (k, v), "combine")
    assert seen[-1][5:7] == (None, None) and seen[-1][9] is None and combined == ["combine"]
    one = decode.prepare(q, k, None, None, 1, Flags(scale=0.5))
    decode.launch(one, main, (k, v), "combine")
    assert seen[-1][5] is one.out and seen[-1][7:10] == (None, None, None) and combined == ["combine"]
