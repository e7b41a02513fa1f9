"""The ATen conversion table (see `table.py`); importing this package fills it."""

# imported for their registration side effect
from . import (  # noqa: F401
    assign,
    complex_numbers,
    creation,
    elementwise,
    experts,
    nn,
    reduction,
    resize,
    scatter,
    shape,
    sorting,
    spectral,
)
from .table import CONVERTERS, TARGETS, Converter, converts

__all__ = ["CONVERTERS", "TARGETS", "Converter", "converts"]
