"""Integer inputs that index a weight table (token ids into an embedding), and their valid range.

Backends disagree on an index outside its table: torch raises, ONNX Runtime's Gather raises with
a kernel message or, for -1, silently reads the last row. So the writer records, for every graph
input that feeds a table lookup of a weight, the range of values the lookup accepts
(`index_inputs` in the manifest), and input validation refuses a value outside it on every
backend, naming the input, the value and its position.

An input is followed through view ops and integer casts (a reshape of the token ids still indexes
the table). The range is torch's: [0, n) for embedding, index_select and gather, [-n, n) for
advanced indexing (`index`), which wraps negative indices like Python.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from compiler.errors import ArtifactError

if TYPE_CHECKING:  # the writer and the graph check pass a Graph; reading the manifest needs none
    from compiler.ir import Graph

MANIFEST_KEY = "index_inputs"
_ALL_VALUES = frozenset({"reshape", "permute", "expand"})


@dataclass(frozen=True)
class IndexRange:
    """Values of input `input` must lie in [lo, hi): it indexes `table` through `op`."""

    input: str
    lo: int
    hi: int
    table: str
    op: str

    def to_json(self) -> dict[str, Any]:
        return {"lo": self.lo, "hi": self.hi, "table": self.table, "op": self.op}


def find_index_inputs(graph: Graph) -> dict[str, IndexRange]:
    """Graph inputs whose values index a weight table, with the tightest range over their uses."""
    origin = {id(v): v.name for v in graph.inputs if v.type.dtype.value.startswith(("i", "u"))}
    found: dict[str, IndexRange] = {}
    for node in graph.nodes:
        lookup = _lookup(graph, node)
        if lookup is not None:
            index, table, size, negative = lookup
            name = origin.get(id(index))
            if name is not None and size is not None:
                new = IndexRange(name, -size if negative else 0, size, table, node.op)
                old = found.get(name)
                if old is None or new.hi - new.lo < old.hi - old.lo:
                    found[name] = new
        if len(node.outputs) == 1 and node.inputs and node.inputs[0] is not None \
                and id(node.inputs[0]) in origin and _keeps_values(node):
            origin[id(node.output)] = origin[id(node.inputs[0])]
    return found


def _keeps_values(node) -> bool:
    """A view that keeps every value (not a slice: the values it drops may index nothing), or a
    cast to another integer type."""
    if node.op == "cast":
        return node.output.type.dtype.value.startswith(("i", "u"))
    return node.op in _ALL_VALUES and len(node.inputs) == 1


def _lookup(graph: Graph, node):
    """(index value, table name, table size along the indexed dim, negatives allowed) or None."""
    ins = node.inputs
    if node.op == "embedding" and len(ins) == 2 and _is_weight(graph, ins[0]):
        return ins[1], ins[0].name, _dim(ins[0], 0), False
    if node.op in ("index_select", "gather") and len(ins) == 2 and _is_weight(graph, ins[0]):
        dim = node.attrs.get("dim")
        if type(dim) is not int:
            return None
        dim %= max(ins[0].type.rank, 1)
        return ins[1], ins[0].name, _dim(ins[0], dim), False
    if node.op == "index" and ins and _is_weight(graph, ins[0]):
        present = [i for i, v in enumerate(ins[1:]) if v is not None]
        if len(present) == 1:  # one index tensor: its values pick along that dim
            return ins[1 + present[0]], ins[0].name, _dim(ins[0], present[0]), True
    return None


def _is_weight(graph: Graph, value) -> bool:
    return value is not None and graph.is_weight(value)


def _dim(value, axis: int) -> int | None:
    """The table's size along `axis`; None where it is not a number (a weight's dims are
    static in every graph dayzero writes; an edited graph may say otherwise)."""
    dim = value.type.shape[axis] if axis < len(value.type.shape) else None
    return dim if isinstance(dim, int) else None


def index_inputs_json(graph: Graph) -> dict[str, dict[str, Any]]:
    """The manifest's `index_inputs` entry for `graph`."""
    return {name: r.to_json() for name, r in sorted(find_index_inputs(graph).items())}


# op -> whether its range is [-n, n) (Python's wrap of negative indices) rather than [0, n)
NEGATIVE_OK = {"embedding": False, "index_select": False, "gather": False, "index": True}
_MAX_INDEX = 2**63


def read_index_inputs(manifest: Mapping[str, Any], input_names: Sequence[str]
                      ) -> dict[str, IndexRange]:
    """The manifest's `index_inputs`, checked for form; {} for artifacts that record none.

    The form includes the op's rule: an embedding, index_select or gather accepts [0, n), an
    advanced index [-n, n), so `lo` is 0 or -hi (a manifest edited to lo = -256 would let
    token id -1 through, which ONNX Runtime's Gather reads as the last row). Whether n is the
    table's size is checked at load against graph.dzir."""
    entries = manifest.get(MANIFEST_KEY, {})
    where = f"manifest.json: {MANIFEST_KEY}"
    fix = "the artifact is corrupted or was edited; recompile it"
    if not isinstance(entries, dict):
        raise ArtifactError(f"manifest.json: {MANIFEST_KEY} is {_short(entries)}, not an "
                            "object", where, fix)
    out = {}
    for name, e in entries.items():
        at = f"{where}.{name if name.isidentifier() and len(name) <= 80 else _short(name)}"
        ok = (name in input_names and isinstance(e, dict)
              and all(type(e.get(k)) is int and abs(e[k]) <= _MAX_INDEX for k in ("lo", "hi"))
              and e["lo"] < e["hi"] and isinstance(e.get("table"), str)
              and len(e["table"]) <= 4096 and isinstance(e.get("op"), str)
              and e["op"] in NEGATIVE_OK)
        if not ok:
            raise ArtifactError(f"manifest.json: {MANIFEST_KEY} entry {_short(name)}: "
                                f"{_short(e)} is not a valid range of a model input", at, fix)
        want = -e["hi"] if NEGATIVE_OK[e["op"]] else 0
        if e["lo"] != want:
            raise ArtifactError(f"manifest.json: {MANIFEST_KEY}.{name}.lo is {e['lo']}, but a "
                                f"lookup by {e['op']} into a table of {e['hi']} rows accepts "
                                f"[{want}, {e['hi']})", f"{at}.lo", fix)
        out[name] = IndexRange(name, e["lo"], e["hi"], e["table"], e["op"])
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
