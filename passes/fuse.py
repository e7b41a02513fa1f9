"""fuse: replace decomposed model-level patterns by fused ops (norms, attention, MLPs, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from compiler.errors import DayzeroError
from compiler.ir import Graph

from .base import Pass, PassResult
from .fusion.sets import PHASES, RULE_SETS, TRANSFORMS, option_of
from .registry import register_pass
from .rewrite import RewriteMiss, RewriteRecord, RuleSet, apply_rules


@register_pass
@dataclass(frozen=True)
class Fuse(Pass):
    """Rewrite decomposed patterns into fused model-level ops, recording each rewrite.

    Needs: a valid graph, best after remove_noops, fold_constants and
    eliminate_common_subexpressions (shared constants and no-ops make patterns regular); weights
    with data for the horizontal merge (it concatenates them).
    Pattern sets (each an option, all on by default; see passes/fusion/): activations (GELU erf
    and tanh forms, SiLU), norms (RMSNorm, LayerNorm, their weight and bias), attention (explicit
    softmax(QK^T*scale+mask)V, repeat_kv -> enable_gqa, causal masks -> is_causal), rotary
    (rotary_embedding), moe (a mixture-of-experts block, its shared expert included -> moe),
    residual (add + norm ->
    add_rms_norm / add_layer_norm), mlp (gated MLP),
    epilogue (linear + bias + activation), horizontal (linears sharing an input -> one linear).
    They run in phases, each to a fixpoint.
    Guarantees: the graph computes the same values (each fused op's reference is its
    decomposition); every node a rewrite creates carries `origin` (the export-level nodes it
    replaced) and the loc of the node it replaced; a pattern whose intermediates are read
    elsewhere is not fused (no work is done twice). The records of the last run are available
    from `records()`.
    Why: backends have one fast kernel for each of these, and a kernel per primitive op spends
    its time moving memory.
    """

    name: ClassVar[str] = "fuse"
    summary: ClassVar[str] = "fuse decomposed norms, attention, rotary, MLPs and linear epilogues"

    activations: bool = True
    norms: bool = True
    attention: bool = True
    rotary: bool = True
    moe: bool = True
    residual: bool = True
    mlp: bool = True
    heads: bool = True
    epilogue: bool = True
    horizontal: bool = True
    max_sweeps: int = 16

    def __post_init__(self):
        if self.max_sweeps < 1:
            raise DayzeroError(f"option 'max_sweeps' of pass 'fuse' must be >= 1, got "
                               f"{self.max_sweeps}", None, "write e.g. fuse{max_sweeps=16}")

    def enabled(self) -> list[str]:
        return [name for phase in PHASES for name in phase if getattr(self, option_of(name))]

    def run(self, graph: Graph) -> PassResult:
        records: list[RewriteRecord] = []
        misses: list[RewriteMiss] = []
        for phase in PHASES:
            names = [n for n in phase if getattr(self, option_of(n))]
            rules = sum((RULE_SETS[n] for n in names if n in RULE_SETS), RuleSet())
            if len(rules):
                records += apply_rules(graph, rules, self.max_sweeps, misses)
            for name in names:
                if name in TRANSFORMS:
                    records += TRANSFORMS[name](graph)
        object.__setattr__(self, "_records", tuple(records))
        object.__setattr__(self, "_misses", tuple(misses))
        return PassResult(graph, bool(records))

    def records(self) -> tuple[RewriteRecord, ...]:
        """What the last `run` rewrote, in order (empty before any run)."""
        return getattr(self, "_records", ())

    def misses(self) -> tuple[RewriteMiss, ...]:
        """Where each rule was tried for the last time in the last `run` and did not match, and
        why (the reasons `compile --report` gives for a pattern that never fired)."""
        return getattr(self, "_misses", ())
