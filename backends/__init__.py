"""Backends: the interface, the plugin registry, and the built-in backends.

`import backends` imports neither torch nor any backend; `backends.get(name)` imports the one
asked for. See docs/backends.md for writing a backend plugin.
"""

from .base import ArtifactView, Backend, Capabilities, Executable, Observer, WeightLocation
from .registry import ENTRY_POINT_GROUP, available, get, register, unregister

__all__ = ["ENTRY_POINT_GROUP", "ArtifactView", "Backend", "Capabilities", "Executable",
           "Observer", "WeightLocation", "available", "get", "register", "unregister"]
