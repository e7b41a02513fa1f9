"""Declarative pattern rewriting: patterns, rules, rule sets and a driver that applies them.

    from passes.rewrite import RuleSet, rule, apply_rules
    SILU = rule("silu", lambda op, x: op.mul(x, op.sigmoid(x)), lambda op, x, **_: op.silu(x))
    records = apply_rules(graph, RuleSet([SILU]))

See pattern.py for the pattern language, rule.py for rules and checks, match.py for how matching
works (read-only, through no-op views and casts, with reasons for failures) and driver.py for how
rewrites are applied and recorded.
"""

from .builder import RewriteBuilder
from .driver import (
    RewriteError,
    RewriteMiss,
    RewriteRecord,
    apply_match,
    apply_rules,
    explain,
    restore_topological_order,
)
from .match import MatchResult, constant_value, match_pattern, strip, transparent_input
from .pattern import AnyOf, Capture, Const, OpBuilder, OpPattern, Pattern, Var, build_pattern
from .rule import CheckContext, Rule, RuleSet, rule

__all__ = ["AnyOf", "Capture", "CheckContext", "Const", "MatchResult", "OpBuilder", "OpPattern",
           "Pattern", "RewriteBuilder", "RewriteError", "RewriteMiss", "RewriteRecord", "Rule",
           "RuleSet", "Var",
           "apply_match", "apply_rules", "build_pattern", "constant_value", "explain",
           "match_pattern", "restore_topological_order", "rule", "strip", "transparent_input"]
