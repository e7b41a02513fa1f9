"""The pattern sets the `fuse` pass can enable, and the phases it runs them in.

Phases run in order, each to a fixpoint: later phases build on the ops earlier ones produce (the
residual rules need the norm with its weight folded in; the epilogue rules must not take the
linears a gated MLP is made of; horizontal merging comes last so that it only merges linears no
pattern claimed; the attention block (`heads`) needs the attention and rotary ops of the
first phase). A phase is a list of pattern-set names.
"""

from __future__ import annotations

from collections.abc import Callable

from compiler.ir import Graph

from ..rewrite import RewriteRecord, RuleSet
from . import activations, attention, heads, latent, mlp, moe, norms, rotary
from .horizontal import merge_horizontal

RULE_SETS: dict[str, RuleSet] = {
    "activations": activations.RULES,
    "norms": norms.RULES,
    "attention": attention.RULES,
    "rotary": rotary.RULES,
    "residual": norms.RESIDUAL_RULES,
    "mlp": mlp.GATED_RULES,
    "moe": moe.RULES,
    "moe_shared": moe.SHARED_RULES,  # a moe's shared expert, once gated_mlp has formed
    "heads": heads.RULES + latent.RULES,  # latent attention: the same block, MLA's keys
    "epilogue": mlp.EPILOGUE_RULES,
}

# Sets that are graph-wide transforms rather than rule sets.
TRANSFORMS: dict[str, Callable[[Graph], list[RewriteRecord]]] = {
    "horizontal": merge_horizontal,
}

PHASES: tuple[tuple[str, ...], ...] = (
    ("activations", "norms", "attention", "rotary", "moe"),
    ("residual", "mlp", "heads", "moe_shared"),
    ("epilogue",),
    ("horizontal",),
)

# sets switched by another set's `fuse` option (the shared-expert rules finish the moe rules)
OPTION_OF: dict[str, str] = {"moe_shared": "moe"}

# the `fuse` options: one per pattern set, less those another set's option switches
SET_NAMES: tuple[str, ...] = tuple(name for phase in PHASES for name in phase
                                   if name not in OPTION_OF)


def option_of(name: str) -> str:
    return OPTION_OF.get(name, name)


def rule_names() -> dict[str, list[str]]:
    """Pattern set -> the names of its rules (what records and reports call them)."""
    out = {name: rules.names for name, rules in RULE_SETS.items()}
    out["horizontal"] = ["merge_linears"]
    return out


def explain_fusion(graph: Graph, node) -> list[tuple[str, str]]:
    """For a node (or its value's name): every rule that could be rooted there, and why it did
    or did not match -- what `--debug` shows for a fusion that did not fire."""
    from ..rewrite import explain

    return explain(graph, node, sum(RULE_SETS.values(), RuleSet()))
