"""`torch.compile(model, backend="dayzero")`: dayzero as a TorchDynamo backend.

Registered through the `torch_dynamo_backends` entry point (pyproject.toml), so it is found by
name after `pip install`. Each graph dynamo hands over is compiled by the same frontend, passes
and backend as `compiler.compile`; see `backend.py` for the whole path.
"""

from .backend import dayzero_backend

__all__ = ["dayzero_backend"]
