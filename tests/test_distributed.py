"""Beyond one device: the fa4 ops on DTensors (`kernels/sharding.py`), tensor-parallel HF Llama compiled with our
backend, and FSDP2 training steps, on two CPU processes over gloo.

The two ranks live for the whole module (`ranks`, a pool of two spawned processes in one process group: the
start-up, importing torch and transformers twice, costs more than most cases); each test sends both ranks one
case, a module-level function that returns plain values, and compares them in the parent. A case that fails
on one rank fails the test with that rank's traceback, and the pool starts afresh for the next test.

What each case shows:
- the ops on DTensors (`_op_case`, `_linear_case`): each rule's placements give the unsharded op's result
  (float64 reference) and keep their placements; placements a rule does not take are redistributed with a
  warning that names them and why, still exact;
- TP (`_tp_case`): HF Llama (4 query / 2 KV heads over 2 ranks) with q/k/v `ColwiseParallel` and o
  `RowwiseParallel` runs every layer through `fa4::attention` on each rank, equal to the unsharded model;
  with `use_local_output=False` the op meets DTensors inside the compiled graph (eager attention code: on a
  CPU, DTensor has no rule for SDPA's CPU kernel, so sdpa code runs with local outputs, as HF's own TP plans);
- FSDP2 (`_fsdp_case`): `fully_shard` at the root, a compiled training step on each rank's own batch:
  `fa4::attention` in the forward graph and `fa4::attention_backward` in the backward graph of every rank,
  loss and the gathered gradients equal to the unsharded model's mean over both batches; with `fully_shard`
  per decoder layer, each layer compiled, sdpa code is rewritten the same way (HF's mask code runs eagerly and
  skips the mask), while with the whole model compiled the mask crosses FSDP2's graph breaks and reaches the
  layer graph as an input, the op's key mask read at run time;
- DDP (`_ddp_case`): the compiled DDP module split by DDPOptimizer at (tiny) gradient buckets, each piece compiled
  by the backend alone: the mask reaches the attention's piece as an input, every layer still on the op, the
  step exact;
- the 2-GPU benchmark script (`fa4_inductor/bench/distributed.py`) passes its own checks on CPUs (slow).
"""

from __future__ import annotations

import os
import queue
import tempfile
import traceback
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# The whole module is in the slow tier: its two gloo processes and their compiles cost ~40 s.
pytestmark = [pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                 reason="needs torch.distributed with gloo"), pytest.mark.slow]

WORLD = 2
CASE_TIMEOUT_S = 600  # a compile with Inductor on two processes sharing two busy cores takes minutes


# ---------------------------------------------------------------------------------------------- the two ranks


def _serve(rank: int, world: int, store: str, tasks, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    import fa4_inductor.kernels  # noqa: F401 (the ops and their sharding rules)

    while (task := tasks.get()) is not None:
        case, args = task
        try:
            results.put((rank, True, case(*args)))
        except BaseException:
            results.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()


class Ranks:
    """`WORLD` spawned processes in one gloo process group, running cases on request."""

    def __init__(self):
        self.processes = []

    def start(self) -> None:
        context = mp.get_context("spawn")
        self.store = tempfile.mktemp(prefix="fa4_dist_")
        self.tasks = [context.Queue() for _ in range(WORLD)]
        self.results = context.Queue()
        self.processes = [context.Process(target=_serve, args=(r, WORLD, self.store, self.tasks[r], self.results),
                                          daemon=True) for r in range(WORLD)]
        for p in self.processes:
            p.start()

    def run(self, case, *args) -> list:
        """case(*args) on every rank; the results by rank."""
        if not self.processes:
            self.start()
        for q in self.tasks:
            q.put((case, args))
        got, failures = {}, []
        try:
            while len(got) + len(failures) < WORLD:
                rank, ok, value = self.results.get(timeout=CASE_TIMEOUT_S if not failures else 30)
                if ok:
                    got[rank] = value
                else:
                    failures.append(f"rank {rank}:\n{value}")
        except queue.Empty:
            failures.append(f"ranks {sorted(set(range(WORLD)) - set(got))} gave no answer")
        if failures:
            self.stop()  # a rank may be waiting in a collective: start afresh
            pytest.fail("\n".join(failures), pytrace=False)
        return [got[r] for r in range(WORLD)]

    def stop(self) -> None:
        for p in self.processes:
            if p.is_alive():
                p.terminate()
            p.join(10)
        self.processes = []
        if os.path.exists(getattr(self, "store", "")):
            os.remove(self.store)

    def close(self) -> None:
        for q in self.tasks if self.processes else []:
            q.put(None)
        for p in self.processes:
            p.join(30)
        self.stop()


@pytest.fixture(scope="module")
def ranks():
    pool = Ranks()
    yield pool
    pool.close()


# ---------------------------------------------------------------------------------------------- cases (on a rank)


def _mesh():
    from torch.distributed.tensor import init_device_mesh

    return init_device_mesh("cpu", (WORLD,))


def _placement(name: str):
    from torch.distributed.tensor import Replicate, Shard

    return {"heads": Shard(1), "batch": Shard(0), "sequence": Shard(2), "replicate": Replicate()}[name]


def _caught(fn):
    """fn()'s result and the messages of the UnshardedWarnings it raised."""
    from fa4_inductor.kernels.sharding import UnshardedWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UnshardedWarning)
        result = fn()
    return result, [str(w.message) for w in caught if issubclass(w.category, UnshardedWarning)]


def _max_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest absolute difference, where equal values (the -inf lse of a row that sees no key) count 0."""
    got, expected = got.double(), expected.double()
    return torch.where(got == expected, 0.0, got - expected).abs().max().item()


def _key_mask_case(placement: str) -> dict:
    """fa4::key_mask on a DTensor mask placed `placement`: the placement kept, no warning, the local result."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    g = torch.Generator().manual_seed(0)
    full = torch.randn(2, 6, 8, generator=g).masked_fill(torch.rand(2, 6, 8, generator=g) < 0.4, 0.0)
    placed = {"replicate": Replicate(), "batch": Shard(0), "keys": Shard(2)}[placement]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.ops.fa4.key_mask.default(distribute_tensor(full, _mesh(), [placed]))
    return dict(placements=str(out.placements), equal=bool(torch.equal(out.full_tensor(), full != 0)),
                warnings=[str(w.message) for w in caught])


def _op_case(placement: str, hq: int, hkv: int, mask: str | None, op: str = "attention",
             replicated_masks: bool = False) -> dict:
    """fa4::attention (or attention_forward, or attention_int8kv over int8 K/V and their scales) on DTensors
    placed `placement` (the masks: Replicate under heads, Shard(0) under batch unless `replicated_masks`),
    forward and backward (through the op's autograd: fa4::attention_backward on DTensors), against the op on
    the full tensors in float64."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = _mesh()
    g = torch.Generator().manual_seed(0)  # the same full tensors on both ranks
    b, sq, sk, d = 2, 6, 8, 16
    q, k, v = torch.randn(b, hq, sq, d, generator=g), torch.randn(b, hkv, sk, d, generator=g), \
        torch.randn(b, hkv, sk, d, generator=g)
    grad_out = torch.randn(b, hq, sq, d, generator=g)
    scales = ()
    if op == "attention_int8kv":
        k, v = (torch.randint(-128, 128, (b, hkv, sk, d), dtype=torch.int8, generator=g) for _ in "kv")
        scales = tuple(torch.rand(b, hkv, sk, generator=g) / 64 + 1e-3 for _ in "kv")
    extra = {}
    if mask == "key_mask":
        extra["key_mask"] = torch.rand(b, sk, generator=g) > 0.3
        extra["key_mask"][:, 0] = True
    elif mask == "seqused_k":
        extra["seqused_k"] = torch.tensor([5, 8], dtype=torch.int32)
    flags = dict(scale=d ** -0.5, causal=mask != "key_mask")
    fn = getattr(torch.ops.fa4, op)

    q64, k64, v64 = (t.double().requires_grad_() if t.is_floating_point() else t for t in (q, k, v))
    out64, lse64 = fn(q64, k64, v64, *scales, **extra, **flags)
    grads64 = torch.autograd.grad(out64, (q64, k64, v64), grad_out.double()) if op == "attention" else ()

    where = [_placement(placement)]
    mask_where = [Shard(0) if placement == "batch" and not replicated_masks else Replicate()]
    dq, dk, dv = (distribute_tensor(t, mesh, where).requires_grad_(op == "attention") for t in (q, k, v))
    dscales = tuple(distribute_tensor(t, mesh, where) for t in scales)
    dextra = {name: distribute_tensor(t, mesh, mask_where) for name, t in extra.items()}
    (out, lse), messages = _caught(lambda: fn(dq, dk, dv, *dscales, **dextra, **flags))
    errors = {"out": _max_error(out.full_tensor(), out64), "lse": _max_error(lse.full_tensor(), lse64)}
    if op == "attention":
        out.backward(distribute_tensor(grad_out, mesh, list(out.placements)))
        for name, t, expected in zip(("dq", "dk", "dv"), (dq, dk, dv), grads64):
            errors[name] = _max_error(t.grad.full_tensor(), expected)
            errors[f"{name} placements"] = str(t.grad.placements)
    return dict(out=str(out.placements), lse=str(lse.placements), local=tuple(out.to_local().shape), errors=errors,
                warnings=messages)


def _linear_inputs(op: str, g: torch.Generator, bias: bool, option) -> tuple[dict, dict, dict]:
    """Full inputs of a quantized linear op (by argument name), its keyword arguments, and each layout's
    placements of the inputs it shards (the rest Replicate). `option`: int8_linear's group size,
    int8_int8_linear's out_dtype, nvfp4_linear's K."""
    from torch.distributed.tensor import Replicate, Shard

    n = 12
    if op == "int8_linear":
        k = 32
        w_scale = torch.rand(n, k // option if option != -1 else 1, generator=g).squeeze(-1) + 0.5
        inputs = dict(x=torch.randn(3, 4, k, generator=g),
                      w_int8=torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g), w_scale=w_scale)
        kwargs, weights = dict(group_size=option), ("w_int8", "w_scale")
        reduction = {"x": Shard(2), "w_int8": Shard(1), "w_scale": Shard(1) if option != -1 else Replicate()}
    elif op == "int8_int8_linear":
        k, m = 32, 6
        inputs = dict(x_int8=torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g),
                      x_scale=torch.rand(m, 1, generator=g) / 64 + 1e-3,
                      w_int8=torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g),
                      w_scale=torch.rand(n, generator=g) / 64 + 1e-3)
        kwargs, weights = dict(out_dtype=option), ("w_int8", "w_scale")
        reduction = {"x_int8": Shard(1), "w_int8": Shard(1)}
    else:
        k = option
        inputs = dict(x=torch.randn(3, 4, k, generator=g),
                      w_fp4=torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g),
                      w_block_scale=(torch.rand(n, k // 16, generator=g) * 2 + 0.25).to(torch.float8_e4m3fn),
                      w_global_scale=torch.tensor(0.37))
        kwargs, weights = {}, ("w_fp4", "w_block_scale")
        # gloo moves no float8: where the blocks do not divide (the op declines), the scales stay replicated
        reduction = {"x": Shard(2), "w_fp4": Shard(1),
                     "w_block_scale": Shard(1) if k // 16 % WORLD == 0 else Replicate()}
    dtype = kwargs.get("out_dtype", torch.float32)
    inputs["bias"] = torch.randn(n, generator=g).to(dtype) if bias else None
    layouts = {"rows": {next(iter(inputs)): Shard(0), "x_scale": Shard(0)},
               "columns": {name: Shard(0) for name in (*weights, "bias")}, "reduction": reduction}
    return inputs, kwargs, layouts


def _linear_case(op: str, layout: str, bias: bool, option) -> dict:
    """fa4::int8_linear, int8_int8_linear or nvfp4_linear on DTensors: rows (x Shard(0)), columns
    (ColwiseParallel's weight Shard(0)), reduction (RowwiseParallel's x Shard(-1), weight Shard(1)), against
    the op on the full tensors."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    mesh = _mesh()
    inputs, kwargs, layouts = _linear_inputs(op, torch.Generator().manual_seed(0), bias, option)
    fn = getattr(torch.ops.fa4, op)
    expected = fn(**inputs, **kwargs)
    where = layouts[layout]
    # Each rank holds the full tensors: no broadcast (gloo has none of float8).
    dinputs = {name: t if t is None else distribute_tensor(t, mesh, [where.get(name, Replicate())],
                                                           src_data_rank=None) for name, t in inputs.items()}
    out, messages = _caught(lambda: fn(**dinputs, **kwargs))
    return dict(out=str(out.placements), error=(out.full_tensor() - expected).abs().max().item(),
                scale=expected.abs().max().item(), warnings=messages)


def _fa4_nodes(graphs) -> list:
    return [n for g in graphs for n in g.graph.nodes
            if isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "fa4"]


class _GraphCounter(torch._inductor.custom_graph_pass.CustomGraphPass):
    """Counts the fa4 ops of each graph Inductor compiles (a user pass, run after ours on the same hook)."""

    def __init__(self):
        self.graphs: list[dict] = []

    def __call__(self, graph) -> None:
        counts = {}
        for n in graph.nodes:
            if isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "fa4":
                counts[n.target.name()] = counts.get(n.target.name(), 0) + 1
        self.graphs.append(counts)

    def uuid(self) -> str:
        return "fa4-test-graph-counter"


def _tp_case(impl: str, local_output: bool, inductor: bool) -> dict:
    """Tiny HF Llama, q/k/v ColwiseParallel and o RowwiseParallel on every layer, compiled with our rewrites
    (Inductor: the real backend, its compiled graphs' fa4 ops counted; otherwise the rewritten graph run
    eagerly, its query inputs inspected): its logits and fa4 calls, and the unsharded model's logits."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.experimental import implicit_replication
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import fa4_inductor
    from fa4_inductor import hf, publishing
    from helpers import Recorder

    tiny = hf.build("llama", impl)
    model = tiny.model
    kwargs = {**tiny.inputs(generator=torch.Generator().manual_seed(1)), "use_cache": False}
    with torch.no_grad():
        expected = model(**kwargs).logits
    mesh = _mesh()
    plan = {name: ColwiseParallel(use_local_output=local_output) for name in ("q_proj", "k_proj", "v_proj")}
    plan["o_proj"] = RowwiseParallel()
    for layer in model.model.layers:
        parallelize_module(layer.self_attn, mesh, plan)
    torch._dynamo.reset()
    queries = []
    if inductor:
        counter = _GraphCounter()
        compiled = torch.compile(model, backend=fa4_inductor.fa4_inductor,
                                 options={"post_grad_custom_pre_pass": counter, "fx_graph_cache": False})
    else:
        recorder = Recorder()
        compiled = torch.compile(model, backend=recorder)
    with torch.no_grad(), implicit_replication(), publishing.collecting() as records:  # rotary tables: Replicate
        got = compiled(**kwargs).logits
    if inductor:
        calls = sum(c.get("fa4::attention_forward", 0) for c in counter.graphs)
    else:
        calls = recorder.count()
        for n in _fa4_nodes(recorder.graphs):
            q = n.args[0].meta["example_value"]
            queries.append(str(q.placements) if isinstance(q, DTensor) else f"{q.shape[1]} local heads")
    return dict(calls=calls, layers=tiny.attention_layers, reasons=[r.detail for r in records if not r.rewritten],
                queries=queries, error=(got - expected).abs().max().item(), scale=expected.abs().max().item())


def _unsharded_steps(model, batches) -> tuple[list[float], list]:
    """A training step of the unsharded model on each rank's batch (labels its input ids, no cache): the losses, and
    the gradients averaged over the batches (what the ranks' reduction gives); the model's gradients zeroed after."""
    losses, mean = [], None
    for batch in batches:
        model.zero_grad()
        loss = model(**batch, labels=batch["input_ids"], use_cache=False).loss
        loss.backward()
        losses.append(loss.item())
        grads = [p.grad / WORLD for p in model.parameters()]
        mean = grads if mean is None else [a + b for a, b in zip(mean, grads)]
    model.zero_grad()
    return losses, mean


def _ddp_case(impl: str, padded: bool) -> dict:
    """A training step of a tiny HF Llama wrapped in DDP and compiled with our backend (graphs run eagerly), each
    rank on its own batch, left-padded or not. DDP's buckets are made small enough (10 KB, the first bucket too) that
    Dynamo's DDPOptimizer splits the graph at every few parameters and hands each piece to the backend alone, as it
    splits a real model at its 25 MB buckets; the reference is the uncompiled model's loss on the rank's batch and its
    gradients averaged over both batches (what DDP's all-reduce gives)."""
    from torch.nn.parallel import DistributedDataParallel

    from fa4_inductor import hf
    from helpers import Recorder

    tiny = hf.build("llama", impl)
    model = tiny.model.train()
    batches = [tiny.inputs(generator=torch.Generator().manual_seed(10 + r), padding=padded) for r in range(WORLD)]
    for batch in batches if padded else []:
        batch["attention_mask"] = batch["attention_mask"].flip(-1)  # left padding
    expected_losses, expected_grads = _unsharded_steps(model, batches)
    bucket_mb = 0.01
    first_bucket = torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
    torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = int(bucket_mb * 2 ** 20)  # DDPOptimizer wants it <= the others
    try:
        ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
        torch._dynamo.reset()
        recorder = Recorder()
        batch = batches[dist.get_rank()]
        loss = torch.compile(ddp, backend=recorder)(**batch, labels=batch["input_ids"], use_cache=False).loss
        loss.backward()
    finally:
        torch.distributed._DEFAULT_FIRST_BUCKET_BYTES = first_bucket
    return dict(loss=loss.item(), expected_loss=expected_losses[dist.get_rank()], graphs=len(recorder.graphs),
                calls=recorder.count(), layers=tiny.attention_layers, reasons=recorder.reasons,
                masks=sorted({r.detail.partition("key_mask=")[2].split(",")[0] for r in recorder.records}),
                grad_error=max((p.grad - e).abs().max().item() for p, e in zip(model.parameters(), expected_grads)),
                grad_scale=max(e.abs().max().item() for e in expected_grads))


FSDP_LAYOUTS = {
    "root": "fully_shard(model), the model compiled",
    "layers": "fully_shard per decoder layer and at the root, the model compiled",
    "layers compiled": "fully_shard per decoder layer and at the root, each decoder layer compiled",
}


def _fsdp_case(impl: str, layout: str, inductor: bool) -> dict:
    """A training step of a tiny HF Llama under FSDP2 (`FSDP_LAYOUTS`), compiled with our backend, each rank on
    its own batch; the unsharded model's loss and gradients averaged over both batches are the reference.
    Inductor: the real backend, the fa4 ops counted in the post-grad graphs; otherwise our rewrites under
    AOTAutograd's eager compilers, graphs recorded."""
    from torch._dynamo.backends.common import aot_autograd
    from torch.distributed.fsdp import fully_shard

    import fa4_inductor
    from fa4_inductor import hf
    from fa4_inductor.lowering import run_torch_ir_passes

    tiny = hf.build("llama", impl)
    model = tiny.model.train()
    batches = [tiny.inputs(generator=torch.Generator().manual_seed(10 + r)) for r in range(WORLD)]
    expected_losses, expected_grads = _unsharded_steps(model, batches)

    mesh = _mesh()
    for layer in model.model.layers if layout != "root" else []:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    torch._dynamo.reset()
    graphs, reasons = [], []
    if inductor:
        counter = _GraphCounter()
        backend = fa4_inductor.fa4_inductor
        options = {"post_grad_custom_pre_pass": counter}
    else:
        options = None

        def record(kind):
            def compiler(gm, example_inputs):
                counts = {}
                for n in _fa4_nodes([gm]):
                    counts[n.target.name()] = counts.get(n.target.name(), 0) + 1
                graphs.append((kind, counts))
                return gm.forward
            return compiler

        def backend(gm, example_inputs):
            records = run_torch_ir_passes(gm, example_inputs, fa4_inductor.Options())
            reasons.extend(r.detail for r in records if not r.rewritten)
            return aot_autograd(fw_compiler=record("forward"), bw_compiler=record("backward"))(gm, example_inputs)

    if layout == "layers compiled":
        for layer in model.model.layers:
            layer.compile(backend=backend, options=options)
        compiled = model
    else:
        compiled = torch.compile(model, backend=backend, options=options)
    batch = batches[dist.get_rank()]
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        loss = compiled(**batch, labels=batch["input_ids"], use_cache=False).loss
        loss.backward()
    losses = [None] * WORLD
    dist.all_gather_object(losses, loss.item())
    grad_errors = [(p.grad.full_tensor() - e).abs().max().item() for p, e in zip(model.parameters(), expected_grads)]
    if inductor:  # Inductor compiles the forward graph first, then the backward graph
        graphs = [("backward" if any("backward" in op for op in c) else "forward", c) for c in counter.graphs]
    forward = sum(c.get("fa4::attention", 0) + c.get("fa4::attention_forward", 0) for kind, c in graphs
                  if kind == "forward")
    backward = sum(c.get("fa4::attention_backward", 0) for kind, c in graphs if kind == "backward")
    return dict(losses=losses, expected_losses=expected_losses, grad_errors=grad_errors,
                grad_scale=max(e.abs().max().item() for e in expected_grads), forward=forward, backward=backward,
                graphs=graphs, reasons=reasons, layers=tiny.attention_layers)


# ---------------------------------------------------------------------------------------------- tests


OP_CASES = [
    pytest.param("heads", 4, 2, "key_mask", "attention", False, "(Shard(dim=1),)", id="heads-gqa-key_mask"),
    pytest.param("heads", 4, 4, None, "attention_forward", False, "(Shard(dim=1),)", id="heads-forward-op"),
    pytest.param("batch", 4, 2, "seqused_k", "attention", False, "(Shard(dim=0),)", id="batch-gqa-seqused_k"),
    pytest.param("batch", 4, 2, "key_mask", "attention", True, "(Shard(dim=0),)", id="batch-replicated-key_mask"),
    pytest.param("replicate", 4, 2, None, "attention", False, "(Replicate(),)", id="replicate"),
    pytest.param("heads", 4, 2, "key_mask", "attention_int8kv", False, "(Shard(dim=1),)", id="int8kv-heads-gqa"),
    pytest.param("batch", 4, 2, "seqused_k", "attention_int8kv", False, "(Shard(dim=0),)", id="int8kv-batch"),
]


@pytest.mark.parametrize("placement, hq, hkv, mask, op, replicated_masks, expected", OP_CASES)
def test_attention_on_dtensors(ranks, placement, hq, hkv, mask, op, replicated_masks, expected):
    """Heads, batch and replicated placements run locally: the outputs keep them (each rank holds its half of
    the heads or the batch), no warning (a replicated key mask next to batch shards is sliced locally), and the
    forward and the gradients equal the float64 op on the full tensors."""
    for r in ranks.run(_op_case, placement, hq, hkv, mask, op, replicated_masks):
        assert r["out"] == r["lse"] == expected and not r["warnings"], r
        if placement != "replicate":
            assert r["local"][{"heads": 1, "batch": 0}[placement]] == {"heads": hq, "batch": 2}[placement] // WORLD
        assert all(v < 1e-5 for name, v in r["errors"].items() if "placements" not in name), r["errors"]
        if op == "attention":
            assert {r["errors"][f"{g} placements"] for g in ("dq", "dk", "dv")} == {expected}, r["errors"]


@pytest.mark.parametrize("placement, expected", [("replicate", "(Replicate(),)"), ("batch", "(Shard(dim=0),)"),
                                                  ("keys", "(Shard(dim=2),)")])
def test_key_mask_on_dtensors(ranks, placement, expected):
    """`fa4::key_mask` (what lowering makes every key mask with) is elementwise: it keeps any placement."""
    for r in ranks.run(_key_mask_case, placement):
        assert r == dict(placements=expected, equal=True, warnings=[]), r


DECLINED = [
    pytest.param("heads", 6, 3, "3 KV heads do not divide over 2 ranks", "attention", id="gqa-kv-heads-not-divisible"),
    pytest.param("sequence", 4, 2, "q S(2), k S(2), v S(2)", "attention", id="sequence-sharded"),
    pytest.param("heads", 6, 3, "3 KV heads do not divide over 2 ranks", "attention_int8kv",
                 id="int8kv-gqa-kv-heads-not-divisible"),
]


@pytest.mark.parametrize("placement, hq, hkv, reason, op", DECLINED)
def test_attention_placements_it_does_not_take_are_redistributed_with_a_warning(ranks, placement, hq, hkv, reason,
                                                                                 op):
    """Sharded KV heads that do not divide over the ranks (3 over 2: rank 0's query heads 0-2 would read its KV
    heads 0-1, where head 2 reads KV head 1 ... a wrong pairing) and sequence shards are not computed locally:
    DTensor redistributes them (the answer stays exact) and the rule warns, naming the inputs and why."""
    for r in ranks.run(_op_case, placement, hq, hkv, None, op):
        assert r["out"] != "(Shard(dim=1),)" or placement == "sequence", r
        assert r["warnings"] and reason in r["warnings"][0] and "DTensor redistributes" in r["warnings"][0], r
        assert all(v < 1e-5 for name, v in r["errors"].items() if "placements" not in name), r["errors"]


LINEAR_CASES = [
    pytest.param("int8_linear", "rows", True, -1, "(Shard(dim=0),)", None, id="int8-rows"),
    pytest.param("int8_linear", "columns", True, 8, "(Shard(dim=2),)", None, id="int8-columns-groups-bias"),
    pytest.param("int8_linear", "reduction", False, -1, "(Partial(sum),)", None, id="int8-reduction-per-channel"),
    pytest.param("int8_linear", "reduction", False, 8, "(Partial(sum),)", None, id="int8-reduction-groups"),
    pytest.param("int8_linear", "reduction", True, -1, None, "the bias would be added once per rank",
                 id="int8-reduction-with-bias"),
    pytest.param("int8_int8_linear", "rows", True, torch.float32, "(Shard(dim=0),)", None, id="int8-int8-rows"),
    pytest.param("int8_int8_linear", "columns", True, torch.bfloat16, "(Shard(dim=1),)", None,
                 id="int8-int8-columns-bf16"),
    pytest.param("int8_int8_linear", "reduction", False, torch.float32, "(Partial(sum),)", None,
                 id="int8-int8-reduction-float32"),
    pytest.param("int8_int8_linear", "reduction", False, torch.bfloat16, None, "only a float32 out_dtype splits K",
                 id="int8-int8-reduction-bf16"),
    pytest.param("nvfp4_linear", "rows", True, 64, "(Shard(dim=0),)", None, id="nvfp4-rows"),
    pytest.param("nvfp4_linear", "columns", True, 64, "(Shard(dim=2),)", None, id="nvfp4-columns-bias"),
    pytest.param("nvfp4_linear", "reduction", False, 64, "(Partial(sum),)", None, id="nvfp4-reduction"),
    pytest.param("nvfp4_linear", "reduction", False, 48, None, "3 16-input scale blocks do not divide over 2 ranks",
                 id="nvfp4-reduction-blocks-not-divisible"),
]


@pytest.mark.parametrize("op, layout, bias, option, expected, reason", LINEAR_CASES)
def test_quantized_linears_on_dtensors(ranks, op, layout, bias, option, expected, reason):
    """ColwiseParallel's and RowwiseParallel's layouts of the quantized linears run locally (a K split leaves a
    Partial sum for the next op to reduce); a K split with a bias, with nvfp4 scale blocks that do not divide
    over the ranks, or of an int8 x int8 product into a 16-bit out_dtype is redistributed, with the reason.
    int8_int8_linear's product is exact: its result is bit for bit the unsharded op's except after a K split."""
    for r in ranks.run(_linear_case, op, layout, bias, option):
        if op == "int8_int8_linear" and expected != "(Partial(sum),)":
            assert r["error"] == 0, r
        assert r["error"] <= 1e-6 * r["scale"], r  # float32 sums in another order
        if expected is not None:
            assert r["out"] == expected and not r["warnings"], r
        else:
            assert r["warnings"] and reason in r["warnings"][0] and "DTensor redistributes" in r["warnings"][0], r


def _nvfp4_blocked_case(layout: str) -> dict:
    """fa4::nvfp4_linear with blocked scales (`scale_layout="blocked"`) on DTensors, after the same call with
    row-major scales of the same shape and placements (N = 128, K = 64: both [128, 4]), so that a sharding
    decision cached for the row-major call would be reused if the layout were not part of DTensor's key."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from fa4_inductor.kernels import nvfp4_blackwell

    mesh, g = _mesh(), torch.Generator().manual_seed(0)
    n, k = 128, 64
    x = torch.randn(3, 4, k, generator=g)
    w_fp4 = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    block = (torch.rand(n, k // 16, generator=g) * 2 + 0.25).to(torch.float8_e4m3fn)
    raw = nvfp4_blackwell.to_blocked(block.view(torch.uint8)).view(torch.float8_e4m3fn).view(n, k // 16)
    global_scale, bias = torch.tensor(0.37), (torch.randn(n, generator=g) if layout == "columns" else None)
    op = torch.ops.fa4.nvfp4_linear
    expected = op(x, w_fp4, block, global_scale, bias)
    # the scales stay replicated (gloo moves no float8): the row-major rule takes them as any shard it wants
    where = {"rows": {"x": Shard(0)}, "columns": {"w_fp4": Shard(0), "bias": Shard(0)},
             "reduction": {"x": Shard(2), "w_fp4": Shard(1)}}[layout]

    def placed(name, t):
        return t if t is None else distribute_tensor(t, mesh, [where.get(name, Replicate())], src_data_rank=None)

    args = [placed("x", x), placed("w_fp4", w_fp4)]
    rest = [placed("w_global_scale", global_scale), placed("bias", bias)]
    rowmajor, rowmajor_warnings = _caught(lambda: op(*args, placed("w_block_scale", block), *rest))
    out, messages = _caught(lambda: op(*args, placed("w_block_scale", raw), *rest, scale_layout="blocked"))
    return dict(out=str(out.placements), rowmajor=str(rowmajor.placements), rowmajor_warnings=rowmajor_warnings,
                error=(out.full_tensor() - expected).abs().max().item(), scale=expected.abs().max().item(),
                warnings=messages)


@pytest.mark.parametrize("layout, expected, rowmajor", [
    ("rows", "(Shard(dim=0),)", "(Shard(dim=0),)"),
    ("columns", None, "(Shard(dim=2),)"),
    ("reduction", None, "(Partial(sum),)"),
])
def test_nvfp4_blocked_scales_on_dtensors(ranks, layout, expected, rowmajor):
    """Blocked scales shard with x's rows only: a column or K split of the blocked tensor is not the blocked layout
    of the scales' shard, so those are redistributed, with the reason, where the row-major call of the same shapes
    runs locally."""
    for r in ranks.run(_nvfp4_blocked_case, layout):
        assert r["rowmajor"] == rowmajor and not r["rowmajor_warnings"], r
        assert r["error"] <= 1e-6 * r["scale"], r
        if expected is not None:
            assert r["out"] == expected and not r["warnings"], r
        else:
            assert r["warnings"] and "128x4 blocked layout" in r["warnings"][0], r
            assert "DTensor redistributes" in r["warnings"][0], r


def test_dtensor_keys_its_nvfp4_sharding_decisions_on_the_scale_layout():
    """DTensor caches a sharding decision under the op's schema, whose key holds the non-tensor arguments the
    op's schema info names: with register_sharding's (int arguments only) a blocked call would reuse a row-major
    call's decision on inputs of the same specs."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._op_schema import OpSchema

    import fa4_inductor.kernels.sharding  # noqa: F401  (registers the rules)

    op = torch.ops.fa4.nvfp4_linear.default
    info = DTensor._op_dispatcher.sharding_propagator.op_to_schema_info[op]
    args = ("x", "w_fp4", "w_block_scale", "w_global_scale", None)
    rowmajor = OpSchema(op, args, {}, schema_info=info)
    assert rowmajor != OpSchema(op, args, {"scale_layout": "blocked"}, schema_info=info)
    assert rowmajor != OpSchema(op, (*args, False, "blocked"), {}, schema_info=info)
    assert rowmajor == OpSchema(op, args, {}, schema_info=info)


# Dynamo of torch 2.11 fails on eager code's head-sharded DTensor matmul under any backend (its fake run of the 4-D
# matmul flattens the sharded head dim: "Attempted to flatten multiple dimensions, with dimension 1 being sharded")
DYNAMO_SHARDED_MATMUL = pytest.mark.skipif(torch.torch_version.TorchVersion(torch.__version__) < (2, 13),
                                           reason="torch 2.11's Dynamo fails on the head-sharded DTensor matmul")
TP_CASES = [
    pytest.param("eager", False, False, id="eager-code-dtensor-outputs", marks=DYNAMO_SHARDED_MATMUL),
    pytest.param("sdpa", True, False, id="sdpa-code-local-outputs"),
    pytest.param("eager", True, False, id="eager-code-local-outputs", marks=pytest.mark.slow),
    pytest.param("eager", False, True, id="eager-code-dtensor-outputs-inductor",
                 marks=(pytest.mark.slow, DYNAMO_SHARDED_MATMUL)),
    pytest.param("sdpa", True, True, id="sdpa-code-local-outputs-inductor", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("impl, local_output, inductor", TP_CASES)
def test_tensor_parallel_llama(ranks, impl, local_output, inductor):
    """Every layer of a TP=2 Llama calls fa4::attention on each rank, on its 2 of the 4 query heads (and 1 of the
    2 KV heads): local tensors, or DTensors sharded by heads when the projections keep DTensor outputs (the
    sharding rule runs them locally), and the logits equal the unsharded model's."""
    for r in ranks.run(_tp_case, impl, local_output, inductor):
        assert r["calls"] == r["layers"] and not r["reasons"], r
        if not inductor:
            query = "2 local heads" if local_output else "(Shard(dim=1),)"
            assert r["queries"] == [query] * r["layers"], r
        assert r["error"] <= 1e-5 * max(1.0, r["scale"]), r


FSDP_CASES = [
    pytest.param("sdpa", False, id="sdpa-code"),
    pytest.param("eager", False, id="eager-code", marks=pytest.mark.slow),
    pytest.param("sdpa", True, id="sdpa-code-inductor", marks=pytest.mark.slow),
]


def _assert_training_matches(r):
    torch.testing.assert_close(r["losses"], r["expected_losses"], atol=1e-5, rtol=1e-5)
    assert max(r["grad_errors"]) <= 1e-5 * max(1.0, r["grad_scale"]), r["grad_errors"]


@pytest.mark.parametrize("impl, inductor", FSDP_CASES)
def test_fsdp2_training_step(ranks, impl, inductor):
    """FSDP2 sharding the model's parameters (one unit: the model's forward is one graph) with our backend: each
    rank's forward graph calls fa4::attention (fa4::attention_forward inside Inductor) and its backward graph
    fa4::attention_backward, once per layer; each rank's loss is the unsharded model's on that rank's batch,
    and the reduced gradients are the unsharded model's mean over both batches."""
    for r in ranks.run(_fsdp_case, impl, "root", inductor):
        assert r["forward"] == r["backward"] == r["layers"] and not r["reasons"], (r["graphs"], r["reasons"])
        _assert_training_matches(r)


PER_LAYER_CASES = [
    pytest.param("sdpa", "layers compiled", "layers", id="sdpa-code-layers-compiled"),
    pytest.param("sdpa", "layers", "mask input", id="sdpa-code-model-compiled"),
    pytest.param("eager", "layers compiled", "mask input", id="eager-code-layers-compiled", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("impl, layout, expected", PER_LAYER_CASES)
def test_fsdp2_per_layer_units(ranks, impl, layout, expected):
    """`fully_shard` per decoder layer: FSDP2's hooks run outside Dynamo (`_dynamo_disable`), so every layer is
    a graph of its own (all layers share it). Compiling the layers alone (torchtitan's way) leaves HF's mask to
    eager code, which skips it for sdpa code without padding: the layer's SDPA call is causal, and its graph
    calls fa4::attention, its backward graph fa4::attention_backward. Compiling the whole model hands the layer
    graph the boolean [B, 1, S, S] mask HF built as a graph input: the op's key mask per query row (on CUDA read
    once on the host and run as FA4's causal attention, backward included), so the layer graph calls the same ops
    and the model's own graphs none. Eager attention code hands it a float mask, whose values are unknown when
    compiling: the op's additive key mask, read on CUDA the same way (its backward gives rows that see no key
    eager's gradient). Training is exact either way."""
    for r in ranks.run(_fsdp_case, impl, layout, False):
        if expected == "layers":
            assert not r["reasons"] and r["graphs"], (r["graphs"], r["reasons"])
            per_graph = {"forward": {"fa4::attention": 1}, "backward": {"fa4::attention_backward": 1}}
            assert all(c == per_graph[kind] for kind, c in r["graphs"]), r["graphs"]  # only layers compile
        else:
            assert not r["reasons"], r["reasons"]
            assert r["forward"] == r["backward"] == 1, r["graphs"]  # the one layer graph
        _assert_training_matches(r)


@pytest.mark.parametrize("impl, padded, mask", [("sdpa", False, "mask per query row"),
                                               ("eager", True, "additive mask input")])
def test_ddp_training_step(ranks, impl, padded, mask):
    """DDP, compiled whole: DDPOptimizer splits the graph at DDP's buckets and compiles each piece with the backend,
    so the mask HF builds reaches a layer's piece as an input. Every layer still calls fa4::attention, with that mask
    as a key mask read at run time (proven from the graph when it is not split), and the step is exact: each rank's
    loss its batch's, the gradients the mean over both batches."""
    for r in ranks.run(_ddp_case, impl, padded):
        assert r["graphs"] > 2 and r["calls"] == r["layers"] and not r["reasons"], r
        assert r["masks"] == [mask], r
        assert abs(r["loss"] - r["expected_loss"]) <= 1e-5 * max(1.0, abs(r["expected_loss"])), r
        assert r["grad_error"] <= 1e-5 * max(1.0, r["grad_scale"]), r


@pytest.mark.slow
def test_the_two_gpu_script_runs_on_cpus():
    """`fa4_inductor/bench/distributed.py` (the lead's 2-GPU benchmark, tests/test_gpu_distributed.py) under
    torchrun with gloo: its --tiny model, attention on DTensors, passes its own --check."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD), "-m",
               "fa4_inductor.bench.distributed", "--tiny", "--check", "--suite", "tp-prefill", "--attention", "eager",
               "--dtensor"]
    for _ in range(2):  # once more after a rank killed at exit (session 30: "terminate called without an active
        # exception" in one slow-tier run of four, under load, after the results and the check had passed)
        done = subprocess.run(command, capture_output=True, text=True, timeout=CASE_TIMEOUT_S)
        if done.returncode == 0 or "terminate called without an active exception" not in done.stderr:
            break
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert "| eager | 64 |" in done.stdout and "| 2/2 |" in done.stdout, done.stdout
