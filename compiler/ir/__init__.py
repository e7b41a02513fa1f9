"""dayzero's IR: graph, types, symbolic shapes, op table, text form and verifier.

Importing this package does not import torch; reference semantics import it when they run.
"""

from .dtypes import DType
from .graph import Graph, Node, Value
from .ops import OPS, OpDef, get_op
from .parser import parse_ir
from .printer import format_node, print_ir
from .symbolic import Dim, symbol
from .types import TensorType
from .verifier import verify

__all__ = ["DType", "Dim", "Graph", "Node", "OPS", "OpDef", "TensorType", "Value", "format_node",
           "get_op", "parse_ir", "print_ir", "symbol", "verify"]
