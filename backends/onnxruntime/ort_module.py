"""ONNX Runtime, imported in one place, with Microsoft's telemetry off.

The official onnxruntime wheels carry the 1DS telemetry SDK on Linux and macOS as well as on
Windows, on by default (the package's Privacy.md). With onnxruntime 1.32.0 the first
`import onnxruntime` of a process creates ~/.cache/Microsoft/DeveloperTools/.onnxruntime/ (a
persistent device id and an SQLite store of events; $XDG_CACHE_HOME where set), and about ten
seconds later a thread of the native library resolves mobile.events.data.microsoft.com to
upload them. dayzero compiles and runs models; it must not write into the user's home or talk
to a network.

What stops it, measured (strace of a process that creates and runs a session): the environment
variable ORT_DISABLE_TELEMETRY=1, read by the native module when it initialises, i.e. on the
first import. Set after that import it changes nothing, and `disable_telemetry_events()`
alone (the Python API) leaves both the folder and the host lookup: it only mutes events that
are not essential. So every dayzero module imports onnxruntime from here, which sets the
variable before the import and calls the API after it (which still helps in a process that
imported onnxruntime before dayzero did). The variable stays set in `os.environ`, so child
processes (the ranks of a local launch, say) inherit it.

The variable is forced to "1", not merely defaulted: dayzero's promise is that it sends nothing.

Importing this module imports onnxruntime: callers import it inside the functions that need it
(`from .ort_module import ort`), so that `import backends.onnxruntime` stays light.
"""

from __future__ import annotations

import os

TELEMETRY_VARIABLE = "ORT_DISABLE_TELEMETRY"

os.environ[TELEMETRY_VARIABLE] = "1"

import onnxruntime as ort  # noqa: E402 - only after the variable is set

if hasattr(ort, "disable_telemetry_events"):  # every release since 1.0; absent in odd builds
    ort.disable_telemetry_events()

__all__ = ["TELEMETRY_VARIABLE", "ort"]
