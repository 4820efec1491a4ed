"""How the fa4 ops run on DTensors: the placements each op computes locally, registered with DTensor.

A tensor-parallel model whose attention inputs stay DTensors (`ColwiseParallel(use_local_output=False)`,
or any code that calls the ops on DTensors, eagerly or inside a compiled graph) reaches these rules; one
that hands the op local tensors (the usual TP plans, FSDP2's unsharded parameters) never does. Each rule
lists, for one mesh dimension, the placements under which the op's local call on every rank computes the
shard of the global result, and DTensor expands them over the mesh's dimensions:

    fa4::attention, fa4::attention_forward (q, k, v, seqused_k, key_mask) -> (out, lse)
        heads      q, k, v Shard(1); seqused_k, key_mask Replicate   ->  out, lse Shard(1)
        batch      every tensor Shard(0)                             ->  out, lse Shard(0)
        replicate  every tensor Replicate                            ->  out, lse Replicate
    fa4::attention_backward (grad_out, q, k, v, out, lse, grad_lse, seqused_k, key_mask) -> (dq, dk, dv)
        the same three: the first seven tensors as q, the masks as above
    fa4::attention_int8kv (q, k, v, k_scale, v_scale, seqused_k, key_mask) -> (out, lse)
        the same three: the scales ([B, Hkv, Sk]) as k and v
    fa4::key_mask (mask) -> the key mask: elementwise, so any Shard(d) gives Shard(d), Replicate gives Replicate
    fa4::int8_linear (x, w_int8, w_scale, bias) -> out [..., N]
        rows       x Shard(d) for a dim d before the last; the weight, scales and bias Replicate -> out Shard(d)
        columns    x Replicate; w_int8, w_scale, bias Shard(0)       ->  out Shard(-1)   (ColwiseParallel)
        reduction  x Shard(-1); w_int8 Shard(1); per-channel scales Replicate, group scales Shard(1)
                   -> out Partial (RowwiseParallel; only without a bias, which would be added once per rank)
        partial    x Partial, the rest Replicate, no bias            ->  out Partial (the op is linear in x)
        replicate  every tensor Replicate                            ->  out Replicate
    fa4::nvfp4_linear (x, w_fp4, w_block_scale, w_global_scale, bias) -> out [..., N]
        int8_linear's five, w_fp4 and w_block_scale as w_int8 and group scales, w_global_scale Replicate;
        with scale_layout="blocked" only rows, partial and replicate (a shard of the blocked layout's tensor
        is not the blocked layout of a shard of the scales)
    fa4::int8_int8_linear (x_int8, x_scale, w_int8, w_scale, bias) -> out [M, N]
        rows       x_int8, x_scale Shard(0)                          ->  out Shard(0)
        columns    w_int8, w_scale, bias Shard(0)                    ->  out Shard(1)
        reduction  x_int8 Shard(1), w_int8 Shard(1), the scales Replicate -> out Partial: only for a float32
                   out_dtype and no bias
        replicate  every tensor Replicate                            ->  out Replicate

A reduction (K split over the ranks) leaves each rank the op over its K slice, and the Partial sum of those is
the op's result up to the roundings of each rank's share. For int8_linear and nvfp4_linear these are a float
linear's RowwiseParallel roundings (each rank's dequantized weight slice is bit for bit the slice of the whole
dequantized weight, as the dequantization is per element; then F.linear rounds the share to x's dtype): what
DTensor computes for the dequantize-then-F.linear code the ops replace. int8_int8_linear's product is an exact
int32 sum that the op converts, scales by x_scale, rounds to out_dtype, scales by w_scale and rounds again: with
a float32 out_dtype every rounding of a share is a float32 one (a float32 GEMM's sums in another order), while
a 16-bit out_dtype would round each share twice to 8 or 11 bits before the sum, errors of the shares' size
where the op's is of the result's: declined. Nor does int8_int8_linear take x_int8 Partial (an int8 sum).

Heads shard only where the KV heads divide evenly over the mesh's ranks (all of them, whichever mesh
dimensions shard the heads): query head h reads KV head h // (Hq // Hkv), and an uneven split would pair a
rank's query heads with another rank's KV heads. Group scales (and nvfp4's 16-input blocks, 8 packed bytes)
shard only where the groups divide evenly (a group never straddles two ranks, nor a byte).

Anything else (q, k, v sharded along the sequence or the head dim, a pending Partial sum, heads that do not
divide) is not computed locally: DTensor redistributes the inputs to the offered placements with the lowest
communication cost (an all-gather, an all-to-all or an all-reduce; the answer stays exact) and the rule
warns once per call signature, naming the inputs and why (`UnshardedWarning`). Replicated inputs that a
strategy wants sharded (a key mask next to batch-sharded q, k, v) cost no communication and no warning.
Sequence-sharded attention is context parallelism, which is
`torch.distributed.tensor.experimental.context_parallel`'s job, not these ops'.

`register_sharding` (torch.distributed.tensor.experimental, the same on torch 2.11 and 2.13) installs the
rules; `kernels/__init__.py` imports this module only where torch.distributed is available.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import torch
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.experimental import register_sharding

HEADS, BATCH = 1, 0  # dims of q, k, v, out and the gradients ([B, H, S, D]) and of lse ([B, H, S])


class UnshardedWarning(UserWarning):
    """A fa4 op met DTensor inputs in placements it does not compute locally: DTensor redistributes them."""


class Strategy(NamedTuple):
    """One way the op runs locally on one mesh dimension: its name, the outputs' placements, and each input
    argument's placement by name (None: the argument is not a tensor)."""

    name: str
    outputs: list
    inputs: dict


def _spec_shape(spec) -> tuple[int, ...]:
    return tuple(spec.tensor_meta.shape)


def _passed(op, args: tuple, kwargs: dict) -> list[tuple[str, object]]:
    """(argument name, what DTensor passed for it) in the order DTensor matches placements to inputs:
    positional arguments, then keyword arguments."""
    names = [a.name for a in op._schema.arguments]
    return list(zip(names, args)) + list(kwargs.items())


def _is_spec(value) -> bool:
    return hasattr(value, "placements") and hasattr(value, "mesh")


def _rule(op, args: tuple, kwargs: dict, strategies: list[Strategy], declined: list[str]) -> list:
    """The (output placements, input placements) pairs register_sharding wants, one per strategy; warns when
    the inputs on some mesh dimension would need a collective to reach any of them."""
    passed = _passed(op, args, kwargs)
    specs = {name: value for name, value in passed if _is_spec(value)}
    _warn_if_redistributed(op, specs, strategies, declined)
    return [(s.outputs, [s.inputs.get(name) if _is_spec(value) else None for name, value in passed])
            for s in strategies]


def _warn_if_redistributed(op, specs: dict, strategies: list[Strategy], declined: list[str]) -> None:
    if not specs:
        return
    mesh_ndim = len(next(iter(specs.values())).placements)
    for dim in range(mesh_ndim):
        current = {name: spec.placements[dim] for name, spec in specs.items()}
        # A replicated input reaches any placement without communication (each rank takes its part).
        if any(all(p == s.inputs.get(name) or p.is_replicate() for name, p in current.items()) for s in strategies):
            continue
        placed = ", ".join(f"{name} {p}" for name, p in current.items())
        offered = "; ".join(s.name for s in strategies)
        why = f" ({'; '.join(declined)})" if declined else ""
        warnings.warn(f"{op.name()} on DTensors: {placed} on mesh dim {dim} is not a placement the op computes "
                      f"locally{why}; DTensor redistributes the inputs to one it does ({offered})",
                      UnshardedWarning, stacklevel=2)


def _mesh_size(specs) -> int:
    return next(s for s in specs if _is_spec(s)).mesh.size()


def _attention_strategies(q, k, tensor_inputs: list[str], outputs: int, masks=("seqused_k", "key_mask")
                          ) -> tuple[list[Strategy], list[str]]:
    """The heads / batch / replicate strategies of an attention op whose q and k specs are given, and why
    heads are not offered (if so)."""
    ranks = _mesh_size((q, k))
    hq, hkv = _spec_shape(q)[HEADS], _spec_shape(k)[HEADS]
    strategies, declined = [], []
    if hq != hkv and hkv % ranks:
        declined.append(f"heads: {hkv} KV heads do not divide over {ranks} ranks, so each rank's query heads "
                        f"would not read its own KV heads ({hq} query heads)")
    else:
        # MHA: q and k split alike even when uneven. GQA: every split of Hkv / ranks KV heads pairs with the
        # split of Hq / ranks query heads that reads it.
        heads = {name: Shard(HEADS) for name in tensor_inputs}
        heads.update({name: Replicate() for name in masks})
        strategies.append(Strategy("heads: q, k, v Shard(1)", [Shard(HEADS)] * outputs, heads))
    strategies.append(Strategy("batch: Shard(0)", [Shard(BATCH)] * outputs,
                               {name: Shard(BATCH) for name in (*tensor_inputs, *masks)}))
    strategies.append(Strategy("replicate", [Replicate()] * outputs,
                               {name: Replicate() for name in (*tensor_inputs, *masks)}))
    return strategies, declined


def attention_rule(op, tensor_inputs=("q", "k", "v")):
    def rule(*args, **kwargs):
        q, k = args[0], args[1]
        strategies, declined = _attention_strategies(q, k, list(tensor_inputs), outputs=2)
        return _rule(op, args, kwargs, strategies, declined)

    return rule


def attention_backward_rule(*args, **kwargs):
    op = torch.ops.fa4.attention_backward.default
    q, k = args[1], args[2]
    strategies, declined = _attention_strategies(q, k, ["grad_out", "q", "k", "v", "out", "lse", "grad_lse"],
                                                 outputs=3)
    return _rule(op, args, kwargs, strategies, declined)


def key_mask_rule(mask, **kwargs):
    op = torch.ops.fa4.key_mask.default
    strategies = [Strategy(f"Shard({d})", [Shard(d)], {"mask": Shard(d)}) for d in range(len(_spec_shape(mask)))]
    strategies.append(Strategy("replicate", [Replicate()], {"mask": Replicate()}))
    return _rule(op, (mask,), kwargs, strategies, [])


def _k_split(ranks: int, bias, k_inputs: dict, groups: int | None = None, unit: str = "scale groups",
             declined_for: str | None = None) -> tuple[dict | None, list[str]]:
    """The reduction strategy's placements of the inputs that hold K (`k_inputs`), or None, and why not. A
    split needs no bias (it would be added once per rank), scale `groups` that divide over the ranks (a group
    never straddles two ranks) and nothing else against it (`declined_for`)."""
    if bias is not None:
        return None, ["reduction and partial: the bias would be added once per rank"]
    if groups is not None and groups % ranks:
        return None, [f"reduction: {groups} {unit} do not divide over {ranks} ranks"]
    if declined_for is not None:
        return None, [f"reduction: {declined_for}"]
    return k_inputs, []


def _linear_strategies(x, rows: tuple[str, ...], columns: tuple[str, ...], replicated: tuple[str, ...],
                       k_split: dict | None, partial: bool, split_columns: bool = True) -> list[Strategy]:
    """A linear layer's strategies: `rows` (x first, then what is indexed by x's rows) Shard(d) for each dim d
    of x before the last; `columns` (the weight, its scales, the bias: [N, ...]) Shard(0) (unless not
    `split_columns`); `k_split` (the inputs holding K, placed as given; None: not offered) -> Partial; x Partial
    -> Partial where the op is linear in x (`partial`); everything Replicate. `replicated` inputs (a scale per
    tensor) stay Replicate."""
    x_dims = len(_spec_shape(x))
    everywhere = {name: Replicate() for name in (*rows, *columns, *replicated)}
    strategies = [Strategy(f"rows: {', '.join(rows)} Shard({d})", [Shard(d)],
                           {**everywhere, **{name: Shard(d) for name in rows}}) for d in range(x_dims - 1)]
    if split_columns:
        strategies.append(Strategy(f"columns: {', '.join(columns)} Shard(0)", [Shard(x_dims - 1)],
                                   {**everywhere, **{name: Shard(0) for name in columns}}))
    if k_split is not None:
        split = ", ".join(name for name, p in k_split.items() if p == Shard(1))
        strategies.append(Strategy(f"reduction: {rows[0]} Shard(-1), {split} Shard(1)",
                                   [Partial()], {**everywhere, rows[0]: Shard(x_dims - 1), **k_split}))
    if partial:
        strategies.append(Strategy(f"partial: {rows[0]} Partial", [Partial()], {**everywhere, rows[0]: Partial()}))
    strategies.append(Strategy("replicate", [Replicate()], everywhere))
    return strategies


def int8_linear_rule(x, w_int8, w_scale, bias=None, *, group_size=-1, scale_after_matmul=False):
    op = torch.ops.fa4.int8_linear.default
    args = (x, w_int8, w_scale, bias)
    grouped = group_size != -1
    k_split, declined = _k_split(_mesh_size(args), bias,
                                 {"w_int8": Shard(1), "w_scale": Shard(1) if grouped else Replicate()},
                                 groups=_spec_shape(w_int8)[1] // group_size if grouped else None)
    strategies = _linear_strategies(x, ("x",), ("w_int8", "w_scale", "bias"), (), k_split, partial=bias is None)
    return _rule(op, args, {}, strategies, declined)


def int8_int8_linear_rule(x_int8, x_scale, w_int8, w_scale, bias=None, *, out_dtype):
    op = torch.ops.fa4.int8_int8_linear.default
    args = (x_int8, x_scale, w_int8, w_scale, bias)
    narrow = None
    if out_dtype != torch.float32:
        narrow = (f"each rank would round its share of the int32 product to {out_dtype} before the sum (the op "
                  f"scales the exact int32 sum), so only a float32 out_dtype splits K")
    k_split, declined = _k_split(_mesh_size(args), bias, {"w_int8": Shard(1)}, declined_for=narrow)
    strategies = _linear_strategies(x_int8, ("x_int8", "x_scale"), ("w_int8", "w_scale", "bias"), (), k_split,
                                    partial=False)
    return _rule(op, args, {}, strategies, declined)


def nvfp4_linear_rule(x, w_fp4, w_block_scale, w_global_scale, bias=None, quantize_activations=False,
                      scale_layout="rowmajor"):
    op = torch.ops.fa4.nvfp4_linear.default
    args = (x, w_fp4, w_block_scale, w_global_scale, bias)
    blocked = scale_layout == "blocked"
    why_blocked = ("the block scales are in the 128x4 blocked layout, whose shards are not the scales' shards "
                   "(only x's rows split)") if blocked else None
    k_split, declined = _k_split(_mesh_size(args), bias, {"w_fp4": Shard(1), "w_block_scale": Shard(1)},
                                 groups=None if blocked else _spec_shape(w_block_scale)[1],
                                 unit="16-input scale blocks", declined_for=why_blocked)
    if blocked:
        declined.insert(0, f"columns: {why_blocked}")
    strategies = _linear_strategies(x, ("x",), ("w_fp4", "w_block_scale", "bias"), ("w_global_scale",), k_split,
                                    partial=bias is None, split_columns=not blocked)
    return _rule(op, args, {}, strategies, declined)


def register() -> None:
    """Installs the rules (DTensor keeps the last registration of an op, so calling it again is harmless)."""
    for op in (torch.ops.fa4.attention.default, torch.ops.fa4.attention_forward.default):
        register_sharding(op)(attention_rule(op))
    register_sharding(torch.ops.fa4.attention_int8kv.default)(
        attention_rule(torch.ops.fa4.attention_int8kv.default, ("q", "k", "v", "k_scale", "v_scale")))
    register_sharding(torch.ops.fa4.attention_backward.default)(attention_backward_rule)
    register_sharding(torch.ops.fa4.key_mask.default)(key_mask_rule)
    register_sharding(torch.ops.fa4.int8_linear.default)(int8_linear_rule)
    register_sharding(torch.ops.fa4.int8_int8_linear.default)(int8_int8_linear_rule)
    register_sharding(torch.ops.fa4.nvfp4_linear.default)(nvfp4_linear_rule)
    _key_on_arguments(torch.ops.fa4.nvfp4_linear.default, 5, ["quantize_activations", "scale_layout"])


def _key_on_arguments(op, first: int, names: list[str]) -> None:
    """Makes DTensor's cache of sharding decisions key on `op`'s non-tensor arguments from position `first` (or
    passed by these `names`): register_sharding keys on int arguments only, and nvfp4_linear's placements
    depend on scale_layout, a str (blocked scales can have the row-major scales' shape)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

    infos = DTensor._op_dispatcher.sharding_propagator.op_to_schema_info
    infos[op] = RuntimeSchemaInfo(static_argnum=first, static_kwargkey=names, needs_pytree=True)


register()
