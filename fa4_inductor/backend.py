"""The Dynamo backend: our graph rewrites, then Inductor for everything else.

    torch.compile(model, backend=fa4_inductor)                    # the module, or backend="fa4_inductor"
    torch.compile(model, backend=fa4_inductor.backend(gqa=False))  # with options (options.py)
    torch.compile(model, backend="fa4_inductor", mode="reduce-overhead", options={...})

`mode` and `options` mean what they mean for the inductor backend: they become Inductor config
patches, so "reduce-overhead" turns on CUDA graphs.
"""

from __future__ import annotations

import logging

import torch
from torch._inductor.compile_fx import compile_fx

from fa4_inductor.lowering import READ_BY_VALUE, module_buffers, run_torch_ir_passes
from fa4_inductor.lowering.graph_edit import copy_of_dynamo_graph
from fa4_inductor.lowering.joint_graph import HOOK as JOINT_HOOK, JointGraphPasses, quantized
from fa4_inductor.lowering.post_grad import HOOK as POST_GRAD_HOOK, PostGradPasses
from fa4_inductor.lowering.subclass_weights import InnerTensorArgs, take_inner_tensors

from . import publishing
from .fp8 import is_torchao_fp8
from .int8 import is_torchao_int8_weight_only
from .nvfp4 import is_torchao_nvfp4
from .options import Options

log = logging.getLogger("fa4_inductor")


def inductor_config_patches(mode: str | None, options: dict | None) -> dict:
    """Inductor config for torch.compile's `mode=` and `options=`, as the inductor backend reads them."""
    patches = dict(torch._inductor.list_mode_options(mode)) if mode else {}
    patches.update(options or {})
    return patches


class Backend:
    """A torch.compile backend with fixed options; `fa4_inductor.backend(**options)` makes one."""

    def __init__(self, options: Options | None = None):
        self.options = options or Options()

    def __call__(self, gm: torch.fx.GraphModule, example_inputs, mode: str | None = None, options: dict | None = None):
        pristine = copy_of_dynamo_graph(gm) if module_buffers(gm, example_inputs) else None
        records = run_torch_ir_passes(gm, example_inputs, self.options)
        patches = inductor_config_patches(mode, options)
        user_pass = patches.get(POST_GRAD_HOOK, getattr(torch._inductor.config, POST_GRAD_HOOK))
        post_grad = PostGradPasses(self.options, user_pass)
        patches[POST_GRAD_HOOK] = post_grad
        user_joint_pass = patches.get(JOINT_HOOK, getattr(torch._inductor.config, JOINT_HOOK))
        patches[JOINT_HOOK] = JointGraphPasses(self.options, gm, user_joint_pass)
        inner = take_inner_tensors(gm, example_inputs) if self.options.subclass_weights else None
        _hint_plain_weights(example_inputs, inner[2].inner_names if inner else {})
        if inner:
            inner_gm, inner_inputs, inner_args = inner
            compiled = InnerTensorCall(compile_fx(inner_gm, inner_inputs, config_patches=patches), inner_args)
        else:
            compiled = compile_fx(gm, example_inputs, config_patches=patches)
        # After compile_fx: a restarted analysis (it raises) leaves no stale records. A backward graph's
        # post-grad records come later, when AOTAutograd compiles it.
        publishing.publish(records + post_grad.records)
        if post_grad.graphs == 0:
            log.info("fa4_inductor: Inductor served this graph's code from its caches, so the post-grad rewrites in "
                     "it (quantized linears) are not listed again; TORCHINDUCTOR_FX_GRAPH_CACHE=0 and "
                     "TORCHINDUCTOR_AUTOGRAD_CACHE=0 list them")
        watched = gm.meta.get(READ_BY_VALUE)
        if watched:
            return BufferGuard(compiled, watched, example_inputs, pristine)
        return compiled

    def rewrite_only(self, gm: torch.fx.GraphModule, example_inputs, **_):
        """The same rewrites, run eagerly without Inductor's code generation: what `explain` uses. A graph with
        quantized inputs (int8 / uint8 / float8 tensors, or tensor subclasses such as torchao's) also goes
        through AOTAutograd with Inductor's decompositions, so the POST_GRAD families (quantized linears) see
        and report on the aten graph they would get under Inductor (close to it: Inductor's own passes before
        that stage do not run, e.g. its one-row matmul decomposition on CUDA); a training graph is split by
        Inductor's partitioner after the joint stage (lowering/joint_graph.py)."""
        publishing.publish(run_torch_ir_passes(gm, example_inputs, self.options))
        if not any(quantized(t) for t in example_inputs):
            return gm.forward
        from torch._functorch.aot_autograd import aot_module_simplified
        from torch._inductor.decomposition import select_decomp_table

        post_grad = PostGradPasses(self.options)

        def post_grad_only(aten_gm: torch.fx.GraphModule, _inputs):
            post_grad(aten_gm.graph)
            aten_gm.recompile()
            publishing.publish(post_grad.records)
            post_grad.records = []
            return aten_gm.forward

        def partition(joint_gm: torch.fx.GraphModule, joint_inputs, **kwargs):
            from torch._functorch.partitioners import min_cut_rematerialization_partition

            JointGraphPasses(self.options, gm)(joint_gm.graph)
            return min_cut_rematerialization_partition(joint_gm, joint_inputs, compiler="inductor", **kwargs)

        return aot_module_simplified(gm, example_inputs, fw_compiler=post_grad_only, bw_compiler=post_grad_only,
                                     partition_fn=partition, decompositions=select_decomp_table())

    def __repr__(self) -> str:
        return f"fa4_inductor.backend({self.options})"

    def __deepcopy__(self, memo):
        # HF's generate deep-copies its CompileConfig, backend included, on every call: a copy is a new callable to
        # Dynamo, which recompiles the decode step each generate (90 against 1198 tokens/s on the H200).
        return self

    def __copy__(self):
        return self


_HINTED: list[bool] = []


# (what the weights are, how to tell them, the function that keeps them as plain buffers, Llama-1B-shaped decode on
# one H100 (docs/benchmarks.md session 53): plain buffers against subclasses compiled as their inner tensors (the
# default) and as subclasses (subclass_weights=False or weights it does not take), ms/token)
_SUBCLASS_WEIGHTS = (
    ("NVFP4", is_torchao_nvfp4, "fa4_inductor.nvfp4.from_torchao", (0.92, 0.97, 2.76)),
    ("int8", is_torchao_int8_weight_only, "fa4_inductor.int8.from_torchao", None),
    ("fp8", is_torchao_fp8, "fa4_inductor.fp8.from_torchao", (1.46, 1.44, 2.71)),
)


def _hint_plain_weights(example_inputs, taken) -> None:
    """Once a process: say that torchao weights reach the graph as tensor subclasses, and how to keep the same weights
    as plain buffers. Where every such weight is compiled as its inner tensors (`taken`, the inputs' positions:
    lowering/subclass_weights.py) only Dynamo's guards on them run Python around each call, which a GPU-bound step
    hides: said at INFO. Otherwise AOTAutograd also unwraps each of them every call: a WARNING."""
    if _HINTED:
        return
    for kind, is_kind, remedy, measured in _SUBCLASS_WEIGHTS:
        positions = [i for i, t in enumerate(example_inputs) if is_kind(t)]
        if not positions:
            continue
        _HINTED.append(True)
        kept = sum(i not in taken for i in positions)
        if kept:
            cost = ("each unwrapped by AOTAutograd on every call" if kept == len(positions) else
                    f"{kept} of them, needing a gradient or written in place, unwrapped by AOTAutograd on every call")
            numbers = f"plain buffers {measured[0]} against {measured[2]} ms/token as subclasses" if measured else ""
        else:
            cost = "compiled as their inner tensors; Dynamo's guards on them still run Python on every call"
            numbers = f"plain buffers {measured[0]} against {measured[1]} ms/token, GPU-bound" if measured else ""
        log.log(logging.WARNING if kept else logging.INFO,
                "%d torchao %s weights reach this graph as tensor subclasses (%s); `%s(model)` before compiling "
                "keeps the same weights as plain buffers with the same outputs (%s)", len(positions), kind, cost,
                remedy, f"H100, Llama-1B-shaped decode: {numbers}" if numbers else "docs/benchmarks.md")
        return


class InnerTensorCall:
    """A compiled graph that takes its subclass weights' inner tensors (lowering/subclass_weights.py), called with
    the weights themselves."""

    def __init__(self, compiled, args: InnerTensorArgs):
        self.compiled, self.expand = compiled, args.expand

    def __call__(self, *args):
        return self.compiled(*self.expand(args))


class BufferGuard:
    """A compiled graph whose rewrites read masks from module buffers by value (nanoGPT's causal `bias`),
    run only while those buffers hold what was read: each call compares their version counters (bumped by
    every in-place update) and data pointers with the ones seen when compiling, on the host, without a
    device sync. Once a buffer has changed, calls run `pristine`, the graph as Dynamo traced it (no rewrite,
    not compiled by Inductor), which is correct for any buffer contents; `torch._dynamo.reset()` and a new
    compile bring the compiled speed back. A Dynamo guard would recompile instead, but a backend cannot add one."""

    def __init__(self, compiled, positions: list[int], example_inputs, pristine: torch.fx.GraphModule):
        self.compiled, self.positions, self.pristine = compiled, positions, pristine
        self.expected = [self._state(example_inputs[i]) for i in positions]
        self.changed = False

    @staticmethod
    def _state(t) -> tuple:
        return t._version, t.data_ptr()

    def __call__(self, *args):
        if not self.changed and any(self._state(args[i]) != e for i, e in zip(self.positions, self.expected)):
            self.changed = True
            log.warning("fa4_inductor: a module buffer that a compiled attention read as its mask changed after "
                        "compiling; this graph now runs as traced, without the rewrite (torch._dynamo.reset() and "
                        "compile again for compiled speed)")
        if self.changed:
            return self.pristine(*args)
        return self.compiled(*args)


def backend(**options) -> Backend:
    """A backend with non-default options, e.g. `backend(gqa=False)`; see `Options` for the names."""
    unknown = set(options) - set(Options.names())
    if unknown:
        raise TypeError(f"unknown fa4_inductor options {sorted(unknown)}; known: {Options.names()}")
    return Backend(Options(**options))


fa4_inductor = Backend()
