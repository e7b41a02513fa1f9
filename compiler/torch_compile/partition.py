"""Graphs with ops dayzero cannot convert: compile the regions it can, run the rest in eager.

As Torch-TensorRT does it: the ATen program that the frontend converts (traced and decomposed by
`compiler.frontend.trace_program`) is partitioned by capability with torch.fx's
CapabilityBasedPartitioner; each supported region becomes a submodule that is compiled to an
artifact, and the unsupported nodes stay torch calls between them. A region whose inputs are
not all tensors (a size computed outside it) stays in eager too: compiling it would freeze that
size into the artifact.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from compiler.frontend import trace_program
from compiler.frontend.fx_to_ir import op_name

from .graph_module import Prepared, dynamic_dims

# submodule, example inputs, dynamic dims per input, whether it returns a tuple -> the module
# that runs its artifact
CompileRegion = Callable[[fx.GraphModule, tuple, tuple, bool], torch.nn.Module]


class _Supported(OperatorSupportBase):
    def __init__(self, unsupported: set[str]):
        self.unsupported = unsupported

    def is_node_supported(self, submodules, node: fx.Node) -> bool:
        return node.op == "call_function" and op_name(node.target) not in self.unsupported


def compile_regions(prepared: Prepared, unsupported: set[str],
                    compile_region: CompileRegion) -> tuple[fx.GraphModule, int, int]:
    """The partitioned module (called with the user's tensors), how many regions were compiled
    and how many stayed in eager."""
    program = trace_program(prepared.module, prepared.example_inputs,
                            prepared.dynamic_shapes)
    module = program.module()
    partitioner = CapabilityBasedPartitioner(module, _Supported(unsupported),
                                             allows_single_node_partition=True)
    fused = partitioner.fuse_partitions(partitioner.propose_partitions())
    calls = [n for n in fused.graph.nodes
             if n.op == "call_module" and n.target.startswith("fused_")]
    for call in calls:
        _bake_weights(fused, call)
    examples = _region_inputs(fused, prepared.example_inputs, {c.target for c in calls})
    compiled = 0
    for call in calls:
        if not all(isinstance(a, fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)
                   for a in call.args):
            continue
        dynamic = tuple(dynamic_dims(a.meta["val"]) for a in call.args)
        region = fused.get_submodule(call.target)
        fused.add_submodule(call.target, compile_region(region, examples[call.target], dynamic,
                                                        _returns_tuple(region)))
        compiled += 1
    fused.recompile()
    return fused, compiled, len(calls) - compiled


def _bake_weights(parent: fx.GraphModule, call: fx.Node) -> None:
    """Arguments read from the parent's attributes (parameters, buffers, constants) become the
    region's own buffers, so that its artifact holds them as weights, not inputs."""
    region = parent.get_submodule(call.target)
    placeholders = [n for n in region.graph.nodes if n.op == "placeholder"]
    kept = []
    for arg, placeholder in zip(call.args, placeholders):
        if isinstance(arg, fx.Node) and arg.op == "get_attr":
            name = f"weight_{placeholder.name}"
            region.register_buffer(name, _attribute(parent, arg.target).detach())
            with region.graph.inserting_before(placeholder):
                read = region.graph.get_attr(name)
            placeholder.replace_all_uses_with(read)
            region.graph.erase_node(placeholder)
        else:
            kept.append(arg)
    call.args = tuple(kept)
    region.recompile()


def _returns_tuple(module: fx.GraphModule) -> bool:
    (out,) = [n for n in module.graph.nodes if n.op == "output"]
    return isinstance(out.args[0], (tuple, list))


def _attribute(module: torch.nn.Module, target: str) -> torch.Tensor:
    for part in target.split("."):
        module = getattr(module, part)
    return module


def _region_inputs(module: fx.GraphModule, inputs: tuple, regions: set[str]) -> dict[str, tuple]:
    """Each region's arguments when `module` runs on the example inputs."""
    seen: dict[str, tuple] = {}

    class Recorder(fx.Interpreter):
        def call_module(self, target, args, kwargs):
            if target in regions:
                seen[target] = tuple(args)
            return super().call_module(target, args, kwargs)

    with torch.no_grad():
        Recorder(module).run(*inputs)
    return seen
