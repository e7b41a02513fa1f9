"""The ATen conversion table (see `table.py`); importing this package fills it."""

# imported for their registration side effect
from . import assign, creation, elementwise, nn, reduction, resize, scatter, shape  # noqa: F401
from .table import CONVERTERS, TARGETS, Converter, converts

__all__ = ["CONVERTERS", "TARGETS", "Converter", "converts"]
