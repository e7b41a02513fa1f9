"""The op set, declared as a table (see `registry.OpDef`); importing this package registers it."""

# imported for their registration side effect
from . import collective, elementwise, fused, nn, reduction, resize, scatter, shape  # noqa: F401
from .registry import KINDS, OPS, REQUIRED, OpDef, ShapeError, define, get_op, register

__all__ = ["KINDS", "OPS", "REQUIRED", "OpDef", "ShapeError", "define", "get_op", "register"]
