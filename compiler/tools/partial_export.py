"""Export that keeps going: the IR of every node the frontend converts, and the ops it cannot.

`compiler.export` stops at the first model with an unsupported op (one error listing all of them),
which is right for compiling but not for a coverage report, which must also count the ops that
did convert. This runs the frontend's own steps (trace, decompose, drop data checks, convert with
its `FxConverter`) and returns what the converter built and what it collected as missing, so
coverage sees exactly what `dayzero compile` would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from compiler.frontend.decompositions import decomposition_table
from compiler.frontend.export import _check_arguments, _export_error, _trace
from compiler.frontend.locations import Location
from compiler.frontend.program import convert_program
from compiler.frontend.runtime_checks import drop_data_checks
from compiler.ir import Graph


@dataclass(frozen=True)
class MissingOp:
    """An ATen op (or size expression) the frontend has no IR for: how often, and where first."""

    name: str
    count: int
    first: Location


@dataclass
class PartialExport:
    graph: Graph  # every converted node; values downstream of a missing op may dangle
    missing: list[MissingOp]


def export_partial(model: torch.nn.Module, example_inputs: tuple,
                   dynamic_shapes=None) -> PartialExport:
    """The model's IR as far as it converts, and the ops that do not (never raises for those)."""
    _check_arguments(model, example_inputs)
    program = _trace(model, tuple(example_inputs), dynamic_shapes)
    try:
        program = program.run_decompositions(decomposition_table())
    except Exception as exc:  # torch's decompositions may raise anything
        raise _export_error("torch could not decompose the exported program of", model,
                            exc) from exc
    drop_data_checks(program)
    graph, converter = convert_program(program, model)
    return PartialExport(graph, _missing({**converter.missing, **converter.errors}))


def _missing(collected: Mapping[str, object]) -> list[MissingOp]:
    """Missing ops and failed converters alike: neither backend gets the node. The count is
    how often the op itself occurs (4 for a line every layer of 4 runs), not every node its
    data-dependent size stopped too, so it reads like the IR ops' counts in the same table."""
    return [MissingOp(name, entry.occurrences or entry.count, entry.first)
            for name, entry in collected.items()]
