"""The torch.export frontend: `export(model, example_inputs, dynamic_shapes)` -> IR Graph."""

from .export import export, trace_program
from .fx_to_ir import ConversionError, UnsupportedOpsError

__all__ = ["ConversionError", "UnsupportedOpsError", "export", "trace_program"]
