"""The triton backend: generated Triton kernels (fusion groups, GEMMs), host ops for the rest.

Lowering stores no code: `backend/kernels.json` lists each kernel (name, member nodes, sha256 of
its source) and the sha256 of the whole kernel module. Loading regenerates the kernels from
graph.dzir with the same deterministic generator and refuses the artifact if any hash differs,
so nothing stored is ever executed, and an artifact written by another generator version is
reported instead of silently run with different kernels. graph.dzir itself is untrusted (its
hash in kernels.json is as easy to rewrite as the text): no name, dim or attribute text of it is
ever written into the kernel source, and the module is checked against the forms the generator
writes before it runs (`source_guard`).

Where kernels run is decided from the environment when the backend is loaded, not by a global
setting: with a CUDA device Triton compiles natively; without one, `TRITON_INTERPRET=1` is set
(unless the user set it) before triton is imported, and the kernels run in Triton's interpreter
on CPU tensors — how CI tests this backend.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from compiler.errors import ArtifactError, DayzeroError
from compiler.ir import OPS, Graph, Node, parse_ir, print_ir

from ..base import ArtifactView, Backend, Capabilities, Executable, WeightLocation
from ..capability_partition import Segment, assign, segments, subgraph
from .emit import POW_EXPONENTS
from .matmul import MATMUL_OPS
from .plan import KERNEL_OPS, LaunchStep, constants, module_source, plan, sha256
from .source_guard import check_source

KERNELS_FILE = "kernels.json"
# 2: matmul/linear/fused_linear as generated GEMM kernels; 3: maximum, minimum, clamp, relu and
# hardsigmoid/hardswish propagate NaN as torch does
GENERATOR_VERSION = 3

# Ops run on the host next to the kernels: zero-copy views, data movement, creation, and the
# library calls (embedding gathers, indexing, attention, paged attention; the pieces of a
# mixture-of-experts layer: sort, topk, histc, index_put, and grouped_matmul, whose Triton
# grouped-GEMM kernel (grouped.py) multiplies each expert's block of rows only, so only routed
# experts are computed).
# MATMUL_OPS are GEMM kernels, or torch.matmul where the template does not fit.
HOST_KINDS = frozenset({"view", "data_movement", "creation"})
HOST_OPS = frozenset({"embedding", "scaled_dot_product_attention", "paged_attention", "index",
                       "index_select", "gather", "cumsum", "masked_scatter", "sort", "topk",
                       "histc", "index_put", "grouped_matmul", "scatter"})
DTYPES = frozenset({"f32", "f16", "bf16", "i64", "i32", "bool"})


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _configure_interpreter() -> bool:
    """Turn on Triton's interpreter when there is no CUDA device; it only takes effect if
    triton is not imported yet (its language functions are bound at import). Returns whether
    triton kernels can run in this process."""
    if _has_cuda() and os.environ.get("TRITON_INTERPRET") != "1":
        return True
    if "triton" in sys.modules:
        return os.environ.get("TRITON_INTERPRET") == "1"
    os.environ.setdefault("TRITON_INTERPRET", "1")
    return os.environ["TRITON_INTERPRET"] == "1"


_USABLE = _configure_interpreter()  # decided once, from the environment, when first imported


def device() -> str:
    """'cuda' when a CUDA device is present; otherwise 'cpu', with Triton's interpreter on."""
    if _has_cuda() and os.environ.get("TRITON_INTERPRET") != "1":
        return "cuda"
    if not (_USABLE or _configure_interpreter()):
        raise DayzeroError("triton was imported without TRITON_INTERPRET=1 on a machine without "
                           "a CUDA device, so its kernels cannot run here",
                           "backend triton", "set TRITON_INTERPRET=1 in the environment before "
                           "starting Python (or import backends.triton before torch.export)")
    return "cpu"


def supported_ops() -> frozenset[str]:
    host = {name for name, op in OPS.items() if op.kind in HOST_KINDS}
    return frozenset(KERNEL_OPS | MATMUL_OPS | HOST_OPS | host)


class TritonBackend(Backend):
    name = "triton"
    # Cleanup, causal masks proved, pattern fusion (the attention block stays split: the flash
    # kernel takes [b, h, s, d] heads; MoE blocks too: their grouped_matmuls compute the routed
    # experts only, where the moe op's decomposition would run every expert), the masks of
    # attention fused from eager matmul/softmax chains proved too, fusion groups (one generated
    # kernel each) and the memory plan the executable places intermediates with.
    default_pipeline = ("remove_noops,fold_constants,eliminate_common_subexpressions,"
                        "recognize_causal_masks,eliminate_dead_code,fuse{heads=false,moe=false},"
                        "recognize_causal_masks,eliminate_dead_code,fuse_groups,plan_memory")

    def capabilities(self) -> Capabilities:
        return Capabilities(ops=supported_ops(), dtypes=DTYPES, symbolic_shapes=True, notes={
            "pow": "only with a constant exponent in {" +
                   ", ".join(str(e) for e in sorted(POW_EXPONENTS)) + "}",
            "scaled_dot_product_attention": "flash-style Triton kernel for 4-d float q/k/v "
                                            "(sliding window included); other ranks and "
                                            "softcap run through torch",
            "paged_attention": "Triton kernel (online softmax over the visible slots) for float "
                               "q with rotary tables shared by every head; otherwise its "
                               "decomposition through torch",
            **{op: "tiled GEMM kernel with the bias and activation fused (f32/f16/bf16); "
                   "integer dtypes and matrix-vector products run through torch.matmul"
               for op in sorted(MATMUL_OPS)}})

    def supports(self, node: Node) -> bool:
        if not super().supports(node):
            return False
        if node.op == "pow":
            graph_constants = _constant_of(node.inputs[1])
            return graph_constants in POW_EXPONENTS
        if node.op == "div":
            return node.attrs.get("rounding_mode") is None
        return True

    def lower(self, graph: Graph, weights: Mapping[str, WeightLocation],
              options: Mapping[str, Any]) -> dict[str, bytes]:
        unknown = sorted(set(options) - {"fallback", "fallback_options"})
        if unknown:
            raise DayzeroError(f"unknown triton backend option(s) {unknown}",
                               "backend_options.triton",
                               "the triton backend takes 'fallback' (a backend name) and "
                               "'fallback_options' (that backend's options)")
        files: dict[str, bytes] = {}
        foreign: list[Segment] = []
        if options.get("fallback"):
            foreign = self._lower_fallback(graph, weights, options["fallback"], files,
                                           options.get("fallback_options") or {})
        steps = plan(graph, _foreign_nodes(foreign))
        source = module_source(steps)
        check_source(source)  # what load will execute passes the same check here
        kernels = [{"name": s.kernel.name, "nodes": list(s.kernel.nodes),
                    "sha256": sha256(s.kernel.source)} for s in steps if s.kernel]
        payload = {"generator_version": GENERATOR_VERSION, "kernels": kernels,
                   "module_sha256": sha256(source),
                   "fallback": options.get("fallback"),
                   "segments": [seg.to_json() for seg in foreign]}
        files[KERNELS_FILE] = json.dumps(payload, indent=1).encode()
        return files

    def _lower_fallback(self, graph: Graph, weights: Mapping[str, WeightLocation], name: str,
                        files: dict[str, bytes], options: Mapping[str, Any]) -> list[Segment]:
        """Tag nodes, and lower each fallback segment with the fallback backend into
        fallback/<i>/ (with its graph text, which the fallback's `load` may read)."""
        from ..registry import get

        fallback = get(name)
        parts = segments(graph, assign(graph, self, fallback))
        foreign = [seg for seg in parts if seg.backend != self.name]
        for i, seg in enumerate(foreign):
            sub = subgraph(graph, seg)
            payload = fallback.lower(sub, {w: weights[w] for w in sub.weights}, options)
            files.update((f"fallback/{i}/{rel}", data) for rel, data in payload.items())
            files[f"fallback/{i}/graph.dzir"] = print_ir(sub).encode()
        return foreign

    def load(self, artifact: ArtifactView, *, session: Mapping[str, Any] | None = None,
             cache_dir: str | os.PathLike | None = None) -> Executable:
        """`session` overrides the fallback segments' session settings (onnxruntime's threads
        and spinning) for this run; the Triton kernels themselves have none. `cache_dir` is
        the per-user folder the kernel module is written to (see `executable.cache_dir`)."""
        where = f"{artifact.root}/backend/{KERNELS_FILE}"
        graph = parse_ir(artifact.graph_text(), source=f"{artifact.root}/graph.dzir")
        try:
            stored = json.loads(artifact.payload_path(KERNELS_FILE).read_text())
            foreign = [Segment(s["backend"], tuple(s["nodes"]), tuple(s["inputs"]),
                               tuple(s["outputs"])) for s in stored.get("segments", [])]
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise ArtifactError(f"cannot read the kernel list: {exc}", where,
                                "recompile the model") from None
        steps = _plan_untrusted(graph, foreign, f"{artifact.root}/graph.dzir")
        source = module_source(steps)
        if stored.get("module_sha256") != sha256(source) or \
                stored.get("generator_version") != GENERATOR_VERSION:
            raise ArtifactError("the kernels regenerated from graph.dzir differ from the ones "
                                "this artifact was compiled with (another dayzero version?)",
                                where, "recompile the model with this dayzero")
        target = device()
        from ..registry import get
        from .executable import TritonExecutable, import_kernels

        extra = {"session": session} if session else {}
        fallbacks = [(seg, get(seg.backend).load(_SegmentView(artifact, f"fallback/{i}"), **extra))
                     for i, seg in enumerate(foreign)]
        slots, arena_bytes = _memory_slots(artifact)
        check_source(source)  # the last gate before the text is executed
        module = import_kernels(source, cache_dir)
        return TritonExecutable(graph, artifact.weights("torch"), steps, module, target,
                                fallbacks, slots, arena_bytes)


def _plan_untrusted(graph: Graph, foreign: list[Segment], where: str) -> list[LaunchStep]:
    """The plan of an artifact's graph; an attribute the generator refuses (a string where a
    number belongs, an unknown activation) makes the artifact the thing reported."""
    try:
        return plan(graph, _foreign_nodes(foreign))
    except ArtifactError:
        raise
    except DayzeroError as exc:
        raise ArtifactError(exc.what, f"{where}: {exc.where}" if exc.where else where,
                            exc.fix) from None


def _memory_slots(artifact: ArtifactView) -> tuple[dict[str, tuple[int, int]], int]:
    """value -> (offset, size) of the manifest's memory plan, and the arena's size."""
    memory = artifact.manifest.get("memory_plan") or {}
    try:
        slots = {b["value"]: (int(b["offset"]), int(b["size"]))
                 for b in memory.get("buffers", [])}
        arena_bytes = int(memory.get("arena_bytes", 0))
        if arena_bytes < 0 or any(o < 0 or n < 0 or o + n > arena_bytes
                                  for o, n in slots.values()):
            raise ValueError("a buffer lies outside the arena")
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"the memory plan is malformed ({type(exc).__name__}: {exc})",
                            f"{artifact.root}/manifest.json: memory_plan",
                            "recompile the model") from None
    return slots, arena_bytes


class _SegmentView:
    """The artifact as a fallback backend sees it: its payload under backend/fallback/<i>/."""

    def __init__(self, artifact: ArtifactView, folder: str):
        self.artifact, self.folder = artifact, folder
        self.root, self.manifest = artifact.root, artifact.manifest

    def graph_text(self) -> str:
        return self.payload_path("graph.dzir").read_text()

    def weights(self, framework: str = "np") -> Mapping[str, Any]:
        return self.artifact.weights(framework)

    def payload_path(self, relpath: str):
        return self.artifact.payload_path(f"{self.folder}/{relpath}")


def _foreign_nodes(foreign: list[Segment]) -> dict[str, int]:
    return {node: i for i, seg in enumerate(foreign) for node in seg.nodes}

def _constant_of(value) -> float | None:
    producer = value.producer
    if producer is None or producer.op != "constant":
        return None
    return constants_of_node(producer)


def constants_of_node(node: Node) -> float | None:
    value = node.attrs.get("value")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and \
            node.output.type.rank == 0:
        return float(value)
    return None


def kernel_sources(graph: Graph) -> dict[str, str]:
    """The generated kernel sources of `graph`, by kernel name (for `dayzero inspect
    --kernels`); empty when every node runs as a host op."""
    return {s.kernel.name: s.kernel.source for s in plan(graph) if s.kernel}


__all__ = ["TritonBackend", "kernel_sources", "device", "supported_ops", "constants"]
