"""cp.async (sm80+) and the 1-D bulk copy (sm90+) as one inline-asm op each, shared by the kernels that
stream global memory through a shared ring (`decode_attention_int8kv.py`, `w4a16_decode_gemm.py`).
cp.async groups: `cute.arch.cp_async_commit_group` / `cp_async_wait_group`; bulk copies complete on an
mbarrier (`cute.arch.mbarrier_*`).
"""

from __future__ import annotations

from cutlass import Int32, Int64
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op


@dsl_user_op
def cp_async(dst, src, size: int, src_size, *, loc=None, ip=None):
    """cp.async of `size` bytes from global address `src` (Int64) to shared address `dst` (Int32), of which
    the first `src_size` are read and the rest zero-filled (0: nothing is read, `src` may be out of bounds)."""
    mode = "cg" if size == 16 else "ca"
    llvm.inline_asm(
        None, [Int32(dst).ir_value(loc=loc, ip=ip), Int64(src).ir_value(loc=loc, ip=ip),
               Int32(src_size).ir_value(loc=loc, ip=ip)],
        f"cp.async.{mode}.shared.global [$0], [$1], {size}, $2;", "r,l,r", has_side_effects=True,
        is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


@dsl_user_op
def bulk_copy_g2s(dst, src, size, mbar, *, loc=None, ip=None):
    """cp.async.bulk of `size` bytes (a runtime multiple of 16) from global address `src` (Int64, 16-byte
    aligned) to shared address `dst` (Int32, 16-byte aligned), completing `size` transaction bytes on the
    mbarrier at shared address `mbar` (Int32). Issued by the calling thread alone (no election)."""
    llvm.inline_asm(
        None, [Int32(dst).ir_value(loc=loc, ip=ip), Int64(src).ir_value(loc=loc, ip=ip),
               Int32(size).ir_value(loc=loc, ip=ip), Int32(mbar).ir_value(loc=loc, ip=ip)],
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];", "r,l,r,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


@dsl_user_op
def prefetch_l2(src, size, *, loc=None, ip=None):
    """cp.async.bulk.prefetch of `size` bytes (a runtime multiple of 16) at global address `src` (Int64, 16-byte
    aligned) into L2; nothing to wait for."""
    llvm.inline_asm(
        None, [Int64(src).ir_value(loc=loc, ip=ip), Int32(size).ir_value(loc=loc, ip=ip)],
        "cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)


def prefetch_l2_span(start, nbytes):
    """L2 prefetch of the `nbytes` (Int64) at global address `start` (Int64), widened to the 16-byte blocks they touch
    (each such block holds a byte of the span, so it is mapped memory)."""
    lo = start & Int64(-16)
    hi = (start + nbytes + 15) & Int64(-16)
    prefetch_l2(lo, Int32(hi - lo))


@dsl_user_op
def prefetch_line_l2(src, *, loc=None, ip=None):
    """prefetch.global.L2 of the cache line holding global address `src` (Int64): a per-thread hint, nothing to wait for."""
    llvm.inline_asm(
        None, [Int64(src).ir_value(loc=loc, ip=ip)], "prefetch.global.L2 [$0];", "l",
        has_side_effects=True, is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
