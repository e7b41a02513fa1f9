"""The torch.export frontend: `export(model, example_inputs, dynamic_shapes)` -> IR Graph."""

from .convert import ConversionError, UnsupportedOpsError
from .export import export, trace_program

__all__ = ["ConversionError", "UnsupportedOpsError", "export", "trace_program"]
