"""The op set, declared as a table (see `registry.OpDef`); importing this package registers it."""

# imported for their registration side effect
from . import (  # noqa: F401
    collective,
    elementwise,
    expert_comm,
    fused,
    latent,
    moe,
    multi_head,
    nn,
    paged,
    paged_latent,
    quantized,
    quantized_moe,
    reduction,
    resize,
    scatter,
    shape,
    sorting,
)
from .registry import KINDS, OPS, REQUIRED, OpDef, ShapeError, define, get_op, register

__all__ = ["KINDS", "OPS", "REQUIRED", "OpDef", "ShapeError", "define", "get_op", "register"]
