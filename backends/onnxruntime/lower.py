"""IR graph -> ONNX ModelProto, built node by node with onnx.helper (never torch.onnx.export).

- Inputs and outputs keep their IR names; symbolic dims become named ONNX dims (the symbol
  names, `s0`), so one model serves every size in range.
- Weights are initializers stored as external data that points into the artifact's safetensors
  files (location relative to the artifact root, offset and length of the tensor's bytes), so
  model.onnx holds only the graph and the artifact holds each weight once; small integer
  weights, which ORT's shape inference reads as data, are stored inline (`_initializer`).
- A weight a native kernel reads in its own layout is stored in that layout (`derived_weights`
  plans it from the variant table's `layouts`; the writer computes it), and the kernel's
  initializer points at those bytes. A graph weight stored only so is read by any other node
  through the inverse ops (`INVERSES`), constant inputs ORT folds at load: a copy, which only a
  model without the kernel (the portable one) makes.
- Every IR node goes through `op_table` (or a fused variant from `fused`), and the ONNX ops it
  became are recorded for `dayzero inspect`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from backends.base import WEIGHT_LAYOUTS, DerivedWeight, WeightLocation
from compiler.errors import DayzeroError
from compiler.ir import DType, Graph, Node, TensorType, format_node
from compiler.ir.ops.fused import Emitter, decompose_into
from compiler.ir.symbolic import dim_str

from . import fused, op_table
from .builder import ONNX_DTYPES, Builder, qualified_op
from .convert_int4 import CODE_TILES, SCALE_TILES, untile_codes, untile_scales
from .convert_packed_linear import PANELS, unpanel
from .position_tables import POSITION_TABLES
from .probe import KernelSet, installed_kernels
from .symdims import symbol_sources

# Opset 21 is the newest that every supported onnxruntime (>= 1.18) runs; it has everything the
# op set needs (LayerNormalization 17, bitwise ops 18, axes-as-input reductions 18).
OPSET = 21
IR_VERSION = 10
CONTRIB_DOMAINS = {"com.microsoft": 1}
# Weights up to this many elements are stored inline in model.onnx, not as external data
# (_initializer): integers and bools, which shape inference reads as data, up to 64; scalars and
# tiny vectors of the float types numpy holds (an epsilon, a scale) up to 8. Other dtypes: never.
INLINE_ELEMENTS = {**dict.fromkeys((DType.i64, DType.i32, DType.i16, DType.i8, DType.u8,
                                    DType.bool), 64),
                   **dict.fromkeys((DType.f64, DType.f32, DType.f16), 8)}


# numpy has no bfloat16 or float8 and ORT's Python API cannot return them, so graph inputs and
# outputs of these types cross the session boundary as float32 (exact: every such value is a
# float32) and are cast inside the model; the executable converts with ml_dtypes.
WIDE_IO = frozenset({DType.bf16, DType.f8e4m3, DType.f8e5m2})


# Layout name -> the ops that give a graph weight back from its stored layout
INVERSES = {PANELS: unpanel, CODE_TILES: untile_codes, SCALE_TILES: untile_scales}


def derived_weights(graph: Graph, kernels: KernelSet) -> dict[str, DerivedWeight]:
    """{stored name: DerivedWeight} for the weights a chosen kernel reads in another layout
    (`fused.Variant.layouts`). The source is replaced (not stored) when such kernels are its
    only readers; a weight also read elsewhere (tied embeddings and lm_head) is stored in both
    layouts, so neither reader copies it at load (the embedding's Gather touches only the rows
    it reads of the mapped file). A weight whose readers would need the layout with different
    parameters, or that the layout does not fit, is stored as it is (the kernels fold it)."""
    names = {id(v): name for name, v in graph.weights.items()}
    readers = {names[id(v)]: 1 for v in graph.outputs if id(v) in names}
    wanted: dict[tuple[str, str], list[dict[str, int] | None]] = {}
    for node, variant in _lowered_nodes(graph.nodes, kernels):
        for v in node.inputs:
            if v is not None and id(v) in names:
                readers[names[id(v)]] = readers.get(names[id(v)], 0) + 1
        for use in variant.layouts if variant is not None else ():
            source = names.get(id(node.inputs[use.input]))
            if source is not None:
                wanted.setdefault((source, use.layout), []).append(use.arguments(node))
    plan = {}
    for (source, layout), params in wanted.items():
        stored = f"{source}.{layout}"
        if stored not in graph.weights and _storable(graph, source, layout, params):
            plan[stored] = DerivedWeight(source, layout, replaces=len(params) == readers[source],
                                         params=params[0])
    return plan


def _storable(graph: Graph, source: str, layout: str, params: list) -> bool:
    """Whether `source` can be stored in `layout` for every reader (one set of parameters)."""
    shape = graph.weights[source].type.shape
    if source not in graph.weight_data or not all(isinstance(d, int) for d in shape):
        return False
    if params[0] is None or any(p != params[0] for p in params):
        return False
    return WEIGHT_LAYOUTS[layout].shape(tuple(shape), **params[0]) is not None


def _lowered_nodes(nodes, kernels: KernelSet):
    """(node, fused variant or None) for each node as `op_table.lower_node` will lower it, a
    decomposed op's inner nodes in its place (their inputs are the op's own values)."""
    from .convert_fused import decomposed

    for node in nodes:
        if op_table.limit(node) is not None:
            yield node, None
            continue
        with warnings.catch_warnings():  # the lowering warns about missing kernels itself
            warnings.simplefilter("ignore", fused.ContribFallbackWarning)
            variant = fused.choose(node, kernels)
        if variant is None and op_table.CONVERTERS[node.op] is decomposed:
            yield from _lowered_nodes(_decomposition(node), kernels)
        else:
            yield node, variant


def _decomposition(node: Node) -> list[Node]:
    """The nodes `convert_fused.decomposed` lowers in place of `node`."""
    emitter = Emitter(Graph(f"decomposed_{node.op}"))
    decompose_into(emitter, node)
    return list(emitter.created)


@dataclass
class Lowered:
    """A lowered model, what each IR node became, and the I/O carried as float32."""

    model: onnx.ModelProto
    nodes: list[dict[str, Any]] = field(default_factory=list)
    wide_io: dict[str, dict[str, str]] = field(default_factory=dict)

    def variants(self) -> dict[str, int]:
        """How many nodes each fused variant took, e.g. {"com.microsoft.Gelu": 12}."""
        counts: dict[str, int] = {}
        for entry in self.nodes:
            if entry["lowering"] not in ("standard", "decomposition"):
                counts[entry["lowering"]] = counts.get(entry["lowering"], 0) + 1
        return counts


def lower_graph(graph: Graph, weights: Mapping[str, WeightLocation],
                kernels: KernelSet | None = None) -> Lowered:
    """The ONNX model for `graph`, whose weights lie at `weights` (paths from the artifact root)."""
    kernels = installed_kernels() if kernels is None else kernels
    reserved = [v.name for v in graph.inputs] + list(graph.weights)
    b = Builder(symbol_sources([(v.name, v.type.shape) for v in graph.inputs]), kernels,
                reserved)
    b.symbol_ranges, b.weight_data = graph.symbols, graph.weight_data
    b.position_tables = graph.analysis(POSITION_TABLES)
    env = b.value_names
    env.update({id(v): _narrow_input(b, v) for v in graph.inputs})
    env.update({id(v): name for name, v in graph.weights.items()})
    b.weight_names = {id(v): name for name, v in graph.weights.items()}
    derived = {name: loc for name, loc in weights.items() if loc.derived is not None}
    b.layouts = {loc.derived: name for name, loc in derived.items()}
    for stored, loc in derived.items():  # a weight stored only in a kernel's layout
        source, layout = loc.derived
        if source in graph.weights and source not in weights:
            env[id(graph.weights[source])] = INVERSES[layout](
                b, stored, graph.weights[source].type.shape)
    record = []
    for node in graph.nodes:
        record.append(_lower_node(b, graph, node, env))
    outputs = _outputs(b, graph, env)
    nodes = _live(b.nodes, outputs)
    kept = {n.name: qualified_op(n) for n in nodes}
    for entry in record:  # what each IR node became, less what no output needs
        entry["onnx"] = [kept[n] for n in entry.pop("_emitted") if n in kept]
    read = {name for node in nodes for name in node.input} | set(outputs)
    initializers = [_initializer(name, graph, weights) for name in graph.weights
                    if name in weights or not _replaced(name, derived)]
    initializers += [_derived_initializer(name, weights[name]) for name in derived
                     if name in read]
    onnx_graph = helper.make_graph(
        nodes, graph.name, [_value_info(v.name, _io_type(v.type)) for v in graph.inputs],
        [_value_info(name, _io_type(v.type)) for name, v in zip(outputs, graph.outputs)],
        initializers + [c for c in b.initializers if c.name in read])
    opsets = [helper.make_opsetid("", OPSET)]
    opsets += [helper.make_opsetid(d, CONTRIB_DOMAINS.get(d, v))
               for d, v in sorted(b.opsets.items())]
    model = helper.make_model(onnx_graph, opset_imports=opsets, producer_name="dayzero",
                              ir_version=IR_VERSION)
    check_structure(model)
    wide = {"inputs": {v.name: v.type.dtype.value for v in graph.inputs
                       if v.type.dtype in WIDE_IO},
            "outputs": {name: v.type.dtype.value for name, v in zip(outputs, graph.outputs)
                        if v.type.dtype in WIDE_IO}}
    return Lowered(model, record, wide)


def _live(nodes: list[onnx.NodeProto], outputs: list[str]) -> list[onnx.NodeProto]:
    """The nodes some output depends on. A fused kernel may read a tensor its IR inputs were
    cut from (GroupQueryAttention takes the packed QKV projection), leaving the cutting nodes
    unread; ONNX Runtime would still run them."""
    needed, kept = set(outputs), []
    for node in reversed(nodes):
        if any(o in needed for o in node.output if o):
            kept.append(node)
            needed.update(i for i in node.input if i)
    return kept[::-1]


def _io_type(type: TensorType) -> TensorType:
    return type.with_dtype(DType.f32) if type.dtype in WIDE_IO else type


def _narrow_input(b: Builder, value) -> str:
    """The ONNX name holding input `value` in its own dtype (a Cast when it arrives as f32)."""
    if value.type.dtype not in WIDE_IO:
        return value.name
    return b.op1("Cast", [value.name], to=ONNX_DTYPES[value.type.dtype])


def _lower_node(b: Builder, graph: Graph, node: Node, env: dict[int, str]) -> dict:
    reason = op_table.limit(node)
    if reason is not None:
        raise DayzeroError(f"the onnxruntime backend cannot lower this node: {reason}",
                           f"node `{format_node(node, graph)}`"
                           + (f" from {node.loc}" if node.loc else ""),
                           "choose another backend for this model (dayzero backends)")
    inputs = [None if v is None else env[id(v)] for v in node.inputs]
    b.begin(node)
    outs, how = op_table.lower_node(b, node, inputs)
    emitted = b.end()
    for value, name in zip(node.outputs, outs):
        env[id(value)] = _rename(b, emitted, name, value.name)
    return {"node": format_node(node, graph), "onnx": b.node_ops[-1], "lowering": how,
            "_emitted": [n.name for n in emitted]}


def _rename(b: Builder, emitted: list[onnx.NodeProto], name: str, want: str) -> str:
    """Give a node's result its IR name when this node produced it and the name is free."""
    producers = [n for n in emitted if name in n.output]
    if not producers or not name.startswith("_"):
        return name  # an input, a weight or a shared constant: not this node's to rename
    new = b.claim(want)
    for n in emitted:
        n.output[:] = [new if o == name else o for o in n.output]
        n.input[:] = [new if i == name else i for i in n.input]
    return new


def _outputs(b: Builder, graph: Graph, env: dict[int, str]) -> list[str]:
    """Output names. An input, weight, constant or repeated value is passed through Identity
    (ONNX outputs must be distinct node results); a WIDE_IO value leaves as float32."""
    produced = {o for n in b.nodes for o in n.output}
    names, seen = [], set()
    for value in graph.outputs:
        name = env[id(value)]
        wide = value.type.dtype in WIDE_IO
        if wide or name not in produced or name in seen:
            alias = b.claim(value.name if value.name != name else f"{name}_out")
            op_type, attrs = ("Cast", {"to": ONNX_DTYPES[DType.f32]}) if wide else ("Identity", {})
            b.nodes.append(helper.make_node(op_type, [name], [alias], name=b.fresh("n"), **attrs))
            name = alias
        seen.add(name)
        names.append(name)
    return names


def _value_info(name: str, type) -> onnx.ValueInfoProto:
    dims = [d if isinstance(d, int) else dim_str(d) for d in type.shape]
    return helper.make_tensor_value_info(name, ONNX_DTYPES[type.dtype], dims)


def _initializer(name: str, graph: Graph, weights: Mapping[str, WeightLocation]) -> TensorProto:
    """A weight's initializer: inline when it has at most `INLINE_ELEMENTS` elements, else
    external data.

    Small integer weights (a lifted index like Falcon's `[-1]`) are what ORT's shape inference
    reads as data: ConstantSharing merges equal constants, so a Slice's inline `axes` [-1] can
    end up reading an external weight, and shape inference cannot read external data (the load
    fails: "Cannot parse data from external tensors"). A float scalar can be merged the same way
    with a constant an optimizer reads (an epsilon, a Range's delta), so any tiny constant stays
    inline. Inline, their bytes are also in model.onnx (a few bytes; the safetensors file keeps
    its copy).
    """
    value, data = graph.weights[name], graph.weight_data.get(name)
    count = math.prod(int(d) for d in value.type.shape)
    if count <= INLINE_ELEMENTS.get(value.type.dtype, -1):
        if hasattr(data, "detach"):  # a torch tensor
            data = data.detach().cpu().numpy()
        if isinstance(data, np.ndarray):  # (a checkpoint's lazy handle stays external)
            array = data.astype(value.type.dtype.to_numpy(), copy=False)
            return numpy_helper.from_array(array.reshape([int(d) for d in value.type.shape]),
                                           name)
    return _external(name, graph, weights)


def _replaced(name: str, derived: Mapping[str, WeightLocation]) -> bool:
    """Whether graph weight `name` is stored only in a kernel's layout."""
    return any(loc.derived[0] == name for loc in derived.values())


def _derived_initializer(name: str, loc: WeightLocation) -> TensorProto:
    """The external initializer of a tensor stored in a kernel's layout."""
    return _external_tensor(name, ONNX_DTYPES[DType(loc.dtype)], loc.shape, loc)


def _external(name: str, graph: Graph, weights: Mapping[str, WeightLocation]) -> TensorProto:
    """An initializer whose bytes stay in the safetensors file, referenced by offset and length."""
    if name not in weights:
        raise DayzeroError(f"weight '{name}' has no location in the artifact", f"weight {name}",
                           "write the weights before lowering "
                           "(compiler.writer.write_artifact)")
    value = graph.weights[name]
    return _external_tensor(name, ONNX_DTYPES[value.type.dtype], value.type.shape, weights[name])


def _external_tensor(name: str, data_type: int, shape, loc: WeightLocation) -> TensorProto:
    tensor = TensorProto()
    tensor.name = name
    tensor.data_type = data_type
    tensor.dims.extend(int(d) for d in shape)
    tensor.data_location = TensorProto.EXTERNAL
    for key, val in (("location", loc.file), ("offset", str(loc.offset)),
                     ("length", str(loc.nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, val
    return tensor


def check_structure(model: onnx.ModelProto) -> None:
    """onnx.checker on the graph with weights stood in by inputs of the same type.

    The external files are not reachable from here (their paths are relative to the artifact
    root, which does not exist yet), so only their declarations are checked here; the tests run
    the path-based checker on finished artifacts.
    """
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    external = [t for t in probe.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    for t in external:
        probe.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    kept = [t for t in probe.graph.initializer if t.data_location != TensorProto.EXTERNAL]
    del probe.graph.initializer[:]
    probe.graph.initializer.extend(kept)
    try:
        onnx.checker.check_model(probe, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise DayzeroError(f"the lowered ONNX model is invalid: {exc}", "backend onnxruntime",
                           "report this as a dayzero bug with the graph's .dzir text") from exc
