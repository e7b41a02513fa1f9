"""graph.dzir read for what the manifest says about it, without the IR parser.

A backend that runs its own payload (ONNX Runtime runs model.onnx) never parses graph.dzir:
parsing a large graph takes seconds and loads sympy and lark. Yet the manifest, the one file
without a hash, must be checked against the graph (its input and output specs, symbols and
index ranges are what input validation trusts). This reads the text line by line in the form
`compiler.ir.printer` writes (one statement a line) and keeps only: the symbols, the inputs and
weights with their types, each node's op, operands, result types and (for index_select and
gather) its `dim`, and the returned values. Types stay text as printed (`f32[1, s0, 64]`),
which is exactly how the writer put them in the manifest. Linear in the text, no evaluation;
a line in any other form is an ArtifactError naming it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from compiler.errors import ArtifactError
from compiler.ir.dtypes import DType

_FIX = "the artifact is corrupted or was edited; recompile it"
_NAME = r'(?:[A-Za-z0-9_.]+|"(?:[^"\\]|\\.)*")'
_REF = rf'[%@]{_NAME}'
_TYPE = r'[A-Za-z0-9_]+\[[^\]]*\]'
_RESULT = re.compile(rf'({_REF}): ({_TYPE})')
_NODE = re.compile(rf'(?P<results>{_REF}: {_TYPE}(?:, {_REF}: {_TYPE})*) = '
                   rf'(?P<op>[A-Za-z_][A-Za-z0-9_]*)\((?P<args>(?:(?:{_REF}|_)'
                   rf'(?:, (?:{_REF}|_))*)?)\)(?P<rest>.*)\Z', re.DOTALL)
_ARG = re.compile(rf'{_REF}|_')
_DECL = re.compile(rf'(input|weight) ({_REF}): ({_TYPE})\Z')
_SYMBOL = re.compile(r'symbol ([A-Za-z_][A-Za-z0-9_]*) in \[(\d{1,19}), (\d{1,19}|inf)\]\Z')
_RETURN = re.compile(rf'return(?: ({_REF}(?:, {_REF})*))?\Z')
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_DIM_ATTR = re.compile(r'(?:^|,)\s*dim=(-?\d{1,19})\s*(?:,|$)')


@dataclass(frozen=True)
class SummaryType:
    """A type as graph.dzir prints it: the dtype, and dims as ints or printed expressions."""

    dtype: DType
    shape: tuple[int | str, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass(eq=False)
class SummaryValue:
    name: str
    type: SummaryType | None  # None: used but never declared (the full parser refuses it)


@dataclass(eq=False)
class SummaryNode:
    op: str
    inputs: list[SummaryValue | None]
    outputs: list[SummaryValue]
    attrs: dict[str, Any]

    @property
    def output(self) -> SummaryValue:
        return self.outputs[0]


@dataclass
class GraphSummary:
    """Duck-types what `runtime.index_inputs.find_index_inputs` reads of a Graph."""

    symbols: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    inputs: list[SummaryValue] = field(default_factory=list)
    weights: dict[str, SummaryValue] = field(default_factory=dict)
    nodes: list[SummaryNode] = field(default_factory=list)
    outputs: list[SummaryValue] = field(default_factory=list)

    def is_weight(self, value: SummaryValue) -> bool:
        return self.weights.get(value.name) is value


def summarize(text: str, path: str) -> GraphSummary:
    """The summary of graph text `text` (`path` names it in errors)."""
    reader = _Reader(path)
    lines = text.split("\n")
    body = [(n, line.strip()) for n, line in enumerate(lines, 1) if line.strip()]
    if not body or not body[0][1].startswith("graph ") or body[-1][1] != "}":
        raise ArtifactError(f"{_file(path)} is not a graph (`graph NAME {{ ... }}`)", path, _FIX)
    for number, line in body[1:-1]:
        reader.line(number, line)
    if reader.returned is None:
        raise ArtifactError(f"{_file(path)} has no return statement", path, _FIX)
    return reader.summary


class _Reader:
    def __init__(self, path: str):
        self.path = path
        self.summary = GraphSummary()
        self.values: dict[str, SummaryValue] = {}
        self.returned: list[SummaryValue] | None = None

    def fail(self, number: int, what: str) -> ArtifactError:
        return ArtifactError(f"{_file(self.path)} line {number} {what}",
                             f"{self.path}: line {number}", _FIX)

    def line(self, number: int, line: str) -> None:
        if self.returned is not None:
            raise self.fail(number, "follows the return statement")
        node = _NODE.match(line)
        if node is not None:
            self.node(number, node)
        elif (decl := _DECL.match(line)) is not None:
            self.declare(number, decl.group(1), decl.group(2), decl.group(3))
        elif (symbol := _SYMBOL.match(line)) is not None:
            hi = None if symbol.group(3) == "inf" else int(symbol.group(3))
            self.summary.symbols[symbol.group(1)] = (int(symbol.group(2)), hi)
        elif (ret := _RETURN.match(line)) is not None:
            refs = _ARG.findall(ret.group(1) or "")
            self.returned = [self.ref(number, r, defined=True) for r in refs]
            self.summary.outputs = self.returned
        else:
            raise self.fail(number, f"is not a statement in the form dayzero writes: "
                                    f"{line[:80]!r}")

    def declare(self, number: int, kind: str, ref: str, type_text: str) -> None:
        sigil = "%" if kind == "input" else "@"
        if ref[0] != sigil:
            raise self.fail(number, f"declares {kind} {ref[:80]} with the wrong sigil")
        value = SummaryValue(self.name(number, ref), self.type(number, type_text))
        if kind == "input":
            self.summary.inputs.append(value)
            self.values[value.name] = value
        else:
            self.summary.weights[value.name] = value

    def node(self, number: int, match: re.Match) -> None:
        outputs = []
        for ref, type_text in _RESULT.findall(match.group("results")):
            if ref[0] != "%":
                raise self.fail(number, f"defines {ref[:80]}, which is not a value")
            value = SummaryValue(self.name(number, ref), self.type(number, type_text))
            self.values[value.name] = value
            outputs.append(value)
        inputs = [None if a == "_" else self.ref(number, a)
                  for a in _ARG.findall(match.group("args"))]
        self.summary.nodes.append(SummaryNode(match.group("op"), inputs, outputs,
                                              _attrs(match.group("rest"))))

    def name(self, number: int, ref: str) -> str:
        body = ref[1:]
        if not body.startswith('"'):
            return body
        try:
            name = json.loads(body)
            name.encode("utf-8")
        except ValueError:  # a bad escape, or a lone surrogate (UnicodeEncodeError)
            raise self.fail(number, f"has the unreadable name {ref[:80]}") from None
        return name

    def ref(self, number: int, ref: str, defined: bool = False) -> SummaryValue:
        name = self.name(number, ref)
        found = (self.values if ref[0] == "%" else self.summary.weights).get(name)
        if found is None:
            if defined:
                raise self.fail(number, f"returns {ref[:80]}, which is never defined")
            return SummaryValue(name, None)
        return found

    def type(self, number: int, text: str) -> SummaryType:
        dtype, _, dims = text[:-1].partition("[")
        try:
            kind = DType(dtype)
        except ValueError:
            raise self.fail(number, f"has the unknown dtype {dtype[:40]!r}") from None
        return SummaryType(kind, tuple(_dim(d) for d in _split_dims(dims)))


def _split_dims(text: str) -> list[str]:
    """`1, Max(1, s0), 64` -> its three dims (commas inside parentheses stay)."""
    if not text.strip():
        return []
    dims, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            dims.append(text[start:i].strip())
            start = i + 1
    dims.append(text[start:].strip())
    return dims


def _dim(text: str) -> int | str:
    return int(text) if text.isdigit() and len(text) <= 19 else text


def _attrs(rest: str) -> dict[str, Any]:
    """The one attribute read here: an integer `dim` (index_select and gather's axis)."""
    bare = _STRING.sub('""', rest).strip()
    if not bare.startswith("{"):
        return {}
    match = _DIM_ATTR.search(bare[1:bare.find("}")] if "}" in bare else "")
    return {"dim": int(match.group(1))} if match else {}


def _file(path: str) -> str:
    return path.rsplit("/", 1)[-1]
