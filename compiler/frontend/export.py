"""`export`: a torch.nn.Module to a dayzero IR Graph, through torch.export.

Steps: trace with torch.export (non-strict, eval mode, no autograd); decompose with torch's default
table minus the ops the IR keeps whole (`decompositions.py`); drop data-dependent runtime checks
(`runtime_checks.py`); convert node by node (`program.py`). torch's own failures come back as a
DayzeroError that keeps torch's key message.
"""

from __future__ import annotations

import torch

from compiler.errors import DayzeroError
from compiler.ir import Graph

from .decompositions import decompose
from .expert_loops import traceable_experts
from .locations import parse_stack
from .program import program_to_graph
from .ragged_experts import fold_ragged_expert_splits
from .refine import (
    MAX_ROUNDS,
    RefineState,
    SpecializedDims,
    constrained_dims,
    fix_lines,
    refine,
    static_dims,
)
from .runtime_checks import drop_data_checks

# Phrases in torch.export's messages -> what the user can do about them.
_HINTS = [
    ("Constraints violated", "change dynamic_shapes as torch suggests above (or relax the Dim "
                             "ranges): the model forces those sizes to be static or related"),
    ("data-dependent", "the model branches on tensor values or makes shapes from them; rewrite "
                       "that line without data-dependent control flow, or make the input static"),
    ("dynamic_shapes", "make dynamic_shapes match forward()'s arguments (one entry per input, "
                       "a dict {axis: Dim} per tensor or None)"),
]
_GENERIC_FIX = ("make the model traceable by torch.export (see torch's message), e.g. replace "
                "Python-side logic on tensor values with tensor ops")


def export(model: torch.nn.Module, example_inputs: tuple, dynamic_shapes=None,
           refined: RefineState | None = None) -> Graph:
    """Trace `model` on `example_inputs` and return its IR Graph with weights attached.

    Dynamic shapes torch.export refuses are retried with torch's suggested ranges and
    relations; `refined`, when given, receives the fixes applied. A dim the model fixes to a
    constant raises `SpecializedDims` (see refine.py)."""
    _check_arguments(model, example_inputs)
    return convert_program(_trace(model, tuple(example_inputs), dynamic_shapes, refined), model)


def trace_program(model: torch.nn.Module, example_inputs: tuple, dynamic_shapes=None):
    """The ExportedProgram `export` converts: traced, decomposed, data-only checks dropped.

    The torch.compile backend partitions this program's graph when some of its ops have no
    converter, so that both see the same ATen ops."""
    _check_arguments(model, example_inputs)
    return _decomposed(_trace(model, tuple(example_inputs), dynamic_shapes), model)


def convert_program(program, model: torch.nn.Module) -> Graph:
    """The IR of a program torch.export traced from `model`: the part of `export` that is
    dayzero's own work (benchmarks/compile_scale.py times it apart from torch.export)."""
    return program_to_graph(_decomposed(program, model), model)


def _decomposed(program, model: torch.nn.Module):
    # the checks first: a data check alone (LLaVA's image-token count) would otherwise send an
    # all-converted program through torch's decompositions; again after, for any they add
    drop_data_checks(program)
    try:
        program = decompose(program)
    except Exception as exc:  # torch's decompositions may raise anything
        raise _export_error("torch could not decompose the exported program of", model,
                            exc) from exc
    if fold_ragged_expert_splits(program.graph):  # leaves their sizes read only by checks
        program.graph_module.recompile()
    drop_data_checks(program)
    return program


def _check_arguments(model, example_inputs) -> None:
    if not isinstance(model, torch.nn.Module):
        raise DayzeroError(f"expected a torch.nn.Module, got {type(model).__name__}",
                           fix="wrap the function in an nn.Module whose forward calls it")
    if not isinstance(example_inputs, (tuple, list)):
        raise DayzeroError(f"example_inputs must be a tuple, got {type(example_inputs).__name__}",
                           fix="pass a tuple of forward()'s positional arguments, e.g. (x,)")


def _trace(model: torch.nn.Module, args: tuple, dynamic_shapes,
           refined: RefineState | None = None):
    # eval() for tracing, then each submodule's own mode back: model.train(flag) would set one
    # flag on every submodule and turn on the dropout of a wrapped model that was in eval mode.
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    state = refined if refined is not None else RefineState()
    original = dynamic_shapes
    try:
        for attempt in range(MAX_ROUNDS + 1):
            try:
                with torch.no_grad(), traceable_experts(model) as swapped:
                    program = torch.export.export(model, args, dynamic_shapes=dynamic_shapes,
                                                  strict=False)
                state.grouped_experts = swapped
                return program
            except Exception as exc:  # torch.export raises many unrelated exception types
                found = refine(exc, dynamic_shapes) if attempt < MAX_ROUNDS else None
                if found is None:
                    unfixable = constrained_dims(exc, model, args, dynamic_shapes)
                    if unfixable:
                        raise _specialized(model, exc, unfixable, dynamic_shapes,
                                           state) from exc
                    raise _export_error("torch.export could not trace", model, exc) from exc
                dynamic_shapes, fixes = found
                state.refinements.extend(fixes)
                state.dynamic_shapes = dynamic_shapes
                static = static_dims(original, dynamic_shapes)
                if static:
                    raise _specialized(model, exc, static, dynamic_shapes, state) from exc
    finally:
        for module, training in modes:
            module.training = training


def _specialized(model: torch.nn.Module, exc: Exception, static: dict[str, int],
                 dynamic_shapes, state: RefineState) -> SpecializedDims:
    names = ", ".join(static)
    error = _export_error("torch.export could not trace", model, exc)
    return SpecializedDims(
        f"{error.what}\ntorch.export finds no graph that is dynamic in {names} (it fixes "
        "them to the example's sizes or states no fix for its guards)", error.where,
        "make those dims static in dynamic_shapes; a forward model with one such dim is "
        "compiled at a few static sizes by compiler.compile (static_sizes=[...] picks them)",
        static, dynamic_shapes, list(state.refinements))


def _export_error(what: str, model: torch.nn.Module, exc: Exception) -> DayzeroError:
    text = str(exc).strip()
    lines = [line.rstrip() for line in text.splitlines()]
    key = next((line.strip() for line in lines if line.strip()), type(exc).__name__)
    detail = [f"  {x.strip()}" for x in lines if x.strip().startswith("- ")][:5]
    detail += _suggested_fixes(lines)
    fix = next((hint for phrase, hint in _HINTS if phrase in text), _GENERIC_FIX)
    message = f"{what} {type(model).__name__}: {type(exc).__name__}: {key}"
    if detail:
        message += "\n" + "\n".join(detail)
    where = f"model {type(model).__name__}"
    loc = parse_stack(text)
    if loc is not None:
        where += f", {loc.describe()}"
    return DayzeroError(message, where=where, fix=fix)


def _suggested_fixes(lines: list[str], limit: int = 12) -> list[str]:
    """torch's 'Suggested fixes:' block (up to its first blank line): the exact remedy."""
    fixes = fix_lines("\n".join(lines))[:limit - 1]
    return ["  Suggested fixes:", *(f"    {line}" for line in fixes)] if fixes else []
