"""The op set, declared as a table (see `registry.OpDef`); importing this package registers it."""

from . import elementwise, nn, reduction, shape  # noqa: F401  (registration side effect)
from .registry import KINDS, OPS, REQUIRED, OpDef, ShapeError, define, get_op, register

__all__ = ["KINDS", "OPS", "REQUIRED", "OpDef", "ShapeError", "define", "get_op", "register"]
