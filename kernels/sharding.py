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
    fa4::int8_linear (x, w_int8, w_scale, bias) -> out [..., N]
        rows       x Shard(d) for a dim d before the last; the weight, scales and bias Replicate -> out Shard(d)
        columns    x Replicate; w_int8, w_scale, bias Shard(0)       ->  out Shard(-1)   (ColwiseParallel)
        reduction  x Shard(-1); w_int8 Shard(1); per-channel scales Replicate, group scales Shard(1)
                   -> out Partial (RowwiseParallel; only without a bias, which would be added once per rank)
        partial    x Partial, the rest Replicate, no bias            ->  out Partial (the op is linear in x)
        replicate  every tensor Replicate                            ->  out Replicate

Heads shard only where the KV heads divide evenly over the mesh's ranks (all of them, whichever mesh
dimensions shard the heads): query head h reads KV head h // (Hq // Hkv), and an uneven split would pair a
rank's query heads with another rank's KV heads. Group scales shard only where the groups divide evenly
(a group never straddles two ranks).

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


def attention_rule(op):
    def rule(*args, **kwargs):
        q, k = args[0], args[1]
        strategies, declined = _attention_strategies(q, k, ["q", "k", "v"], outputs=2)
        return _rule(op, args, kwargs, strategies, declined)

    return rule


def attention_backward_rule(*args, **kwargs):
    op = torch.ops.fa4.attention_backward.default
    q, k = args[1], args[2]
    strategies, declined = _attention_strategies(q, k, ["grad_out", "q", "k", "v", "out", "lse", "grad_lse"],
                                                 outputs=3)
    return _rule(op, args, kwargs, strategies, declined)


def int8_linear_rule(x, w_int8, w_scale, bias=None, *, group_size=-1, scale_after_matmul=False):
    op = torch.ops.fa4.int8_linear.default
    args = (x, w_int8, w_scale, bias)
    x_dims = len(_spec_shape(x))
    replicated = {name: Replicate() for name in ("x", "w_int8", "w_scale", "bias")}
    strategies = [Strategy(f"rows: x Shard({d})", [Shard(d)], {**replicated, "x": Shard(d)})
                  for d in range(x_dims - 1)]
    strategies.append(Strategy("columns: w_int8, w_scale, bias Shard(0)", [Shard(x_dims - 1)],
                               {"x": Replicate(), "w_int8": Shard(0), "w_scale": Shard(0), "bias": Shard(0)}))
    declined = []
    if bias is not None:
        declined.append("reduction and partial: the bias would be added once per rank")
    else:
        ranks = _mesh_size(args)
        groups = _spec_shape(w_int8)[1] // group_size if group_size != -1 else 1
        if group_size != -1 and groups % ranks:
            declined.append(f"reduction: {groups} scale groups do not divide over {ranks} ranks")
        else:
            scale = Shard(1) if group_size != -1 else Replicate()
            strategies.append(Strategy("reduction: x Shard(-1), w_int8 Shard(1)", [Partial()],
                                       {"x": Shard(x_dims - 1), "w_int8": Shard(1), "w_scale": scale}))
        strategies.append(Strategy("partial: x Partial", [Partial()], {**replicated, "x": Partial()}))
    strategies.append(Strategy("replicate", [Replicate()], replicated))
    return _rule(op, args, {}, strategies, declined)


def register() -> None:
    """Installs the rules (DTensor keeps the last registration of an op, so calling it again is harmless)."""
    for op in (torch.ops.fa4.attention.default, torch.ops.fa4.attention_forward.default):
        register_sharding(op)(attention_rule(op))
    register_sharding(torch.ops.fa4.attention_backward.default)(attention_backward_rule)
    register_sharding(torch.ops.fa4.int8_linear.default)(int8_linear_rule)


register()
