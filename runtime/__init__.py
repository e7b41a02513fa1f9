"""Runtime: load a compiled artifact and run it.

Imports neither torch nor the compiler's frontend or passes, so an artifact whose backend needs
only numpy (ONNX Runtime, say) runs where torch is not installed.
"""

from .artifact import FORMAT_NAME, FORMAT_VERSION, Artifact, open_artifact
from .model import CompiledModel, load
from .specs import TensorSpec

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "Artifact", "CompiledModel", "TensorSpec", "load",
           "open_artifact"]
