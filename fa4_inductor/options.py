"""The backend's knobs: one frozen dataclass, one field per rewrite family."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Options:
    sdpa: bool = True
    """Rewrite `F.scaled_dot_product_attention` calls into `fa4::attention`."""

    handwritten: bool = True
    """Rewrite hand-written `softmax(q @ k^T * scale + mask) @ v` into `fa4::attention`."""

    gqa: bool = True
    """Fold K/V head repetition (repeat_kv, repeat_interleave, expand + reshape) into GQA."""

    int8_kv: bool = True
    """Attention over K/V dequantized from an int8 cache (`fa4_inductor.Int8StaticCache`, gpt-fast-style int8
    caches: `(k_int8.float() * k_scale[..., None]).to(dtype)`) reads the int8 cache and its scales itself,
    `fa4::attention_int8kv` (lowering/int8_kv.py); off: the dequantized K/V go to `fa4::attention`."""

    padding: bool = True
    """Rewrite attention under a run-time key-padding mask (an `attention_mask`): the op takes the mask as
    its key_mask, exact for left, right or holed padding (on CUDA: our decode kernel for decode-shaped
    calls, the SDPA fallback otherwise, since FA4 takes no key mask)."""

    checked_padding: bool = False
    """Send padding masks down FA4's fast paths instead, under an in-graph check: encoders' masks as
    seqused_k (checked to be right padding), decoders' causal masks dropped (checked to hide no key the
    causal band shows: unpadded batches, `generate`'s all-ones mask). A mask that fails the check stops
    the program (on CUDA a device-side assert, which ends the process) where default torch.compile runs
    it, hence off by default."""

    additive_masks_on_op: bool = True
    """Eager attention code whose mask is a float graph input (generate's static or hybrid cache builds it outside
    the forward; values unknown when compiling) runs on the op, which reads K/V un-repeated: a decode step's mask is
    added to the scores on our decode kernel (Gemma-2's softcap included); a prefill's is read on the host, FA4 where
    it is generate's left-padded causal mask of 0 and finfo.min, else the SDPA fallback with it. Off: SDPA with the
    mask (floored) as given, Gemma-2 as written (no softcap). H200, Llama-1B shape, eager code (session 23): padded
    prefill 33.0 against 46.2 ms off (89.4 default compile), generate 1269 against 1069 tokens/s (1010)."""

    run_time_masks: bool = True
    """A boolean SDPA mask [B or 1, 1, Sq, Sk] that the graph does not prove a band or padding (HF's mask for packed
    sequences from explicit position_ids, Llama 4's chunked layers over more than a chunk) reaches the op as its key
    mask per query row, exact for any contents; the op reads it on the host (a sync a forward) and runs FA4 varlen
    where it is sequences packed back to back, a left-padded causal band or a sliding window, else the SDPA
    fallback with it. Off: such calls stay as written. H200, Llama-1B shape, 16 x 512 packed in 8192 tokens
    (session 24): forward 31.5 against 64.9 ms off (65.4 default compile), a training step 111 against 223 ms."""

    small_calls_to_sdpa: bool = True
    """On CUDA, leave small attentions in host-bound graphs (lowering/crossover.py: self-attention by FLOP, and
    decode steps by the bytes a graph moves per attention) on PyTorch's SDPA, whose C++ host path beats the op's
    where the kernels take microseconds; and keep a hand-written attention's padded training under 2048 keys as
    written (`crossover.PADDED_TRAINING_MIN_KEYS`), where eager's attention is cheaper than the op with eager's
    gradient for rows that see no key."""

    rotary_tables: bool = True
    """Have Inductor compute a rotary embedding's cos / sin tables once and every layer read them
    (lowering/rotary_tables.py), where it would evaluate both functions again for every element of every layer's q
    and k, forward and backward. Off: as default compile does."""

    int8_linear: bool = True
    """Rewrite int8 weight-only linears (gpt-fast's `WeightOnlyInt8Linear`, torchao's `Int8WeightOnlyConfig`,
    a weight dequantized per channel or per group, then `F.linear`) into `fa4::int8_linear`, on Inductor's
    aten graphs (lowering/int8_linear.py); on CUDA the op runs quack's int8 GEMM for small M and a dense GEMM
    above (kernels/int8_linear.py). Measured on the H200 (docs/benchmarks.md, session 7): 11-600x faster than
    default compile's `_weight_int8pack_mm` from M = 4 to 4096 on Llama-1B shapes; one-row matmuls that Inductor
    has decomposed for its fused dequantize GEMV are rewritten too, except where that GEMV measured faster
    (`inductor_gemvs`)."""

    int8_int8_linear: bool = True
    """Rewrite torchao's `Int8DynamicActivationInt8WeightConfig` linears (`_int_mm` of a per-token int8
    activation and an int8 weight, then both scales) into `fa4::int8_int8_linear` where default compile
    cannot serve them (M <= 16 rows, where `_int_mm` refuses on CUDA; a symbolic M is decided for the compiled
    call's under a guard); lowering/int8_int8_linear.py. Above 16 rows the matmul stays with default compile,
    which fuses both scales into the GEMM's epilogue (docs/benchmarks.md, sessions 17 and 18)."""

    nvfp4_linear: bool = True
    """Rewrite NVFP4 weight-only linears (torchao's `NVFP4WeightOnlyConfig`, `fa4_inductor.nvfp4.NVFP4Linear`, user
    code that decodes e2m1 codes and multiplies e4m3 block scales, then `F.linear`) into `fa4::nvfp4_linear`, on
    Inductor's aten graphs (lowering/nvfp4_linear.py). On CUDA, on sm90, only where the op measured faster than
    default compile (H200, docs/benchmarks.md session 14): matmuls of at most 16 rows (our W4A16 decode GEMM,
    2.3-14x), and of at most 256 rows over weights of 2^24 or more (quack's GEMM, 1.08-1.94x); other row counts keep
    default compile's dequantize-then-matmul (`kernels/nvfp4_linear.rows_reason`; a symbolic count is decided for
    the compiled call's, under a guard)."""

    fp8_linear: bool = True
    """Rewrite float8_e4m3fn weight linears into `fa4::fp8_linear`, on Inductor's aten graphs (lowering/fp8_linear.py):
    torchao's `Float8DynamicActivationFloat8WeightConfig` (`torch._scaled_mm` of the fp8 activation and weight with
    their scales; on CUDA only where the op does not call `_scaled_mm` again: at most 16 rows, a symbolic count decided
    per call) and `Float8WeightOnlyConfig` (a weight dequantized in float32, then the matmul). On CUDA the op runs our
    decode GEMM for at most 16 rows (kernels/fp8_linear.py; its H200 timings are pending), else `torch._scaled_mm` or
    the dequantize-then-matmul the graph had."""

    sibling_linears: bool = True
    """With `nvfp4_linear` / `int8_linear`: group the calls of that op that read the same x (a layer's q / k / v, its
    gate / up) into one `fa4::nvfp4_sibling_linears` / `fa4::int8_sibling_linears` (lowering/sibling_linears.py),
    which runs them in one launch of the GEMV where each would run on it (one row of x): H200, docs/benchmarks.md
    session 26, NVFP4 Llama-1B's q / k / v 2.9 against 5.3 us, gate / up 8.1 against 8.7. Elsewhere it runs the calls
    one by one, as without it."""

    gated_linears: bool = True
    """With `sibling_linears` and `nvfp4_linear`: a gated MLP's gate / up siblings over one row of x and their SiLU
    (or tanh-GELU) product become one `fa4::nvfp4_gated_linear` (lowering/gated_linears.py), which on CUDA runs both
    weights and the product in one launch of the integer GEMV (a decode step of batch 1 saves the kernel Inductor
    fuses the activation and the product into): H200, docs/benchmarks.md session 30, NVFP4 Llama-1B decode step
    0.818 / 0.820 against 0.866 / 0.866 ms off, runs alternating."""

    inductor_gemvs: bool = True
    """With `coordinate_descent_tuning` on (torchao's `quantize_` and gpt-fast turn it on), Inductor decomposes one-row
    matmuls into a multiply and a sum before our stage and emits a fused dequantize-GEMV kernel; the quantized
    families see the matmul again (lowering/gemv.py). On, such a linear stays with Inductor's GEMV where that measured
    faster than the op for its weight's shape on the H200 (`int8_linear.gemv_reason`, `nvfp4_linear.gemv_reason`);
    off, every one goes to the op (what `docs/scripts/one_row_gemv.py` measures)."""

    subclass_weights: bool = True
    """Hand Inductor each tensor-subclass weight that needs no gradient (torchao's quantized weights) as its inner
    tensors, the graph rebuilding the subclass (lowering/subclass_weights.py): a call reads them by attribute, where
    AOTAutograd would unwrap every subclass in Python around every call (torch 2.11: two thirds of the profiled host
    time of a host-bound fp8 decode step over 112 torchao linears, H100, docs/benchmarks.md session 52). Off: the
    subclasses reach AOTAutograd as they are."""

    recompute_dequantized_weights: bool | None = None
    """In training, compute each weight dequantized from frozen quantized codes again in the backward instead of
    saving it from the forward (lowering/joint_graph.py): a compiled step then holds no copy of those weights in the
    model's dtype between its forward and backward (default torch.compile holds 2 bytes a weight there; eager none),
    and the forward's quantized linears are rewritten as at inference. The backward pays one more dequantization a
    weight. None (the default): int8 codes, where that measured faster than default compile (H100, Llama-1B shape:
    30.2 against 31.5 ms a step, 4.5 against 6.5 GiB), and fp8 codes (a cast and a multiply as int8's; not timed:
    torchao's fp8 linears have no backward), not NVFP4's packed codes, where it measured slower (H200: 48.4-60.6
    against 36.7 ms; saved: 30.9); True: every format (NVFP4's step 1.8 GiB smaller);
    False: none, Inductor's partitioner saves them (docs/benchmarks.md sessions 54 and 55)."""

    nvfp4_activations: bool = False
    """With `nvfp4_linear`: on Blackwell GPUs (sm100 / sm120) quantize each NVFP4 linear's activations to NVFP4 too
    (an e4m3 scale per 16 inputs, a per-row scale from the row's amax, computed on the device at every call) and
    run the block-scaled FP4 tensor cores (`torch._scaled_mm`; kernels/nvfp4_blackwell.py). W4A4 changes the
    numerics (~9% relative RMS error on random activations), hence off. Elsewhere (Hopper, CPU) and for shapes
    that path declines (K not a multiple of 32, N not a multiple of 16) nothing changes. Not yet run on a
    Blackwell GPU."""

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
