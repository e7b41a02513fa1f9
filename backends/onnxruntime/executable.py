"""A loaded ONNX Runtime model: positional inputs in, numpy outputs out.

On the load path: imports numpy and onnxruntime only (no torch, no onnx).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from compiler.errors import InputError
from compiler.ir.dtypes import DType

if TYPE_CHECKING:
    from .session import ResolvedSession


class OrtExecutable:
    """Runs one InferenceSession; inputs in graph order, outputs in graph order."""

    def __init__(self, session, record: dict[str, Any],
                 settings: ResolvedSession | None = None):
        self.session = session
        self.record = record
        self.settings = settings  # the session settings as applied (None: not reported)
        self.input_names = [i.name for i in session.get_inputs()]
        self.output_names = [o.name for o in session.get_outputs()]
        wide = record.get("wide_io", {})
        self._wide_in = set(wide.get("inputs", {}))
        self._wide_out = {name: _numpy_dtype(dtype)
                          for name, dtype in wide.get("outputs", {}).items()}

    def describe(self) -> str | None:
        """The session settings as applied on this machine, `auto` spinning decided: the
        lowering record keeps what was configured, this says what this load runs with."""
        return self.settings.describe() if self.settings is not None else None

    def __call__(self, inputs: Sequence[Any]) -> list[np.ndarray]:
        if len(inputs) != len(self.input_names):
            raise InputError(f"expected {len(self.input_names)} inputs, got {len(inputs)}",
                             "onnxruntime executable",
                             f"pass inputs in the order {', '.join(self.input_names)}")
        feeds = {name: _array(x) for name, x in zip(self.input_names, inputs)}
        for name in self._wide_in:
            feeds[name] = feeds[name].astype(np.float32)
        outputs = self.session.run(self.output_names, feeds)
        return [out if name not in self._wide_out else out.astype(self._wide_out[name])
                for name, out in zip(self.output_names, outputs)]


def _numpy_dtype(name: str) -> np.dtype:
    return DType(name).to_numpy()


def _array(x: Any) -> np.ndarray:
    """A contiguous numpy view of a numpy array or a CPU torch tensor (without importing torch)."""
    if type(x) is np.ndarray and x.flags.c_contiguous:  # every step's inputs: nothing to do
        return x
    if hasattr(x, "detach") and hasattr(x, "numpy"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, order="C")  # not ascontiguousarray: it makes a 0-d input [1]
