"""Hugging Face models as `from_pretrained` returns them, made exportable without user code.

A transformers model's forward takes a dozen keyword arguments, returns a ModelOutput and, for
decoders, builds a DynamicCache that torch.export cannot return. Users used to copy a wrapper
from examples/llama.py; `wrap_pretrained` is that wrapper, written once: the cache off, the
example inputs passed by the names of the model's own forward signature (so the artifact's
inputs are `input_ids`, `attention_mask`, `pixel_values`, ...), and one tensor out: `logits`
for heads (causal LMs, classifiers, multimodal generators), `last_hidden_state` for base models.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from .errors import DayzeroError

# ModelOutput fields tried in order: the one tensor a compiled artifact returns
OUTPUT_FIELDS = ("logits", "last_hidden_state", "pooler_output")


def is_pretrained(module: Any) -> bool:
    """A transformers PreTrainedModel (checked by class name: transformers is not imported)."""
    return any(cls.__name__ == "PreTrainedModel" for cls in type(module).__mro__)


class PretrainedForward(torch.nn.Module):
    """`model(**inputs, use_cache=False, return_dict=True).<field>` with positional inputs named
    as the model's forward names them."""

    def __init__(self, model: torch.nn.Module, names: list[str], field: str):
        super().__init__()
        self.model, self.names, self.field = model, list(names), field
        self.cache_off = "use_cache" in inspect.signature(model.forward).parameters

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        kwargs = dict(zip(self.names, tensors))
        if self.cache_off:
            kwargs["use_cache"] = False
        return getattr(self.model(**kwargs, return_dict=True), self.field)


def wrap_pretrained(model: torch.nn.Module, inputs: tuple | Mapping[str, Any], spec: str
                    ) -> tuple[torch.nn.Module, tuple]:
    """The exportable module and its positional example inputs (see the module docstring)."""
    accepted = list(inspect.signature(model.forward).parameters)
    if isinstance(inputs, Mapping):
        unknown = [name for name in inputs if name not in accepted]
        if unknown:
            raise DayzeroError(f"{type(model).__name__}.forward takes no input(s) {unknown}", spec,
                               f"name inputs as its forward does: {', '.join(accepted[:8])}, ...")
        names, values = list(inputs), tuple(inputs.values())
    else:
        names, values = accepted[:len(inputs)], tuple(inputs)
    field = _output_field(model, names, values, spec)
    wrapper = PretrainedForward(model.eval(), names, field)
    # torch.export names the graph's inputs after forward's parameters: give this instance's
    # forward the model's names
    signature = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                   for n in names])
    wrapper.forward = _named_forward(wrapper, signature)
    return wrapper, values


def _named_forward(wrapper: PretrainedForward, signature: inspect.Signature):
    def forward(*tensors: torch.Tensor) -> torch.Tensor:
        return PretrainedForward.forward(wrapper, *tensors)

    forward.__signature__ = signature
    return forward


def _output_field(model: torch.nn.Module, names: list[str], values: tuple, spec: str) -> str:
    """The first of OUTPUT_FIELDS the model's output has, found by running it once."""
    kwargs = dict(zip(names, values))
    if "use_cache" in inspect.signature(model.forward).parameters:
        kwargs["use_cache"] = False
    with torch.no_grad():
        out = model.eval()(**kwargs, return_dict=True)
    for field in OUTPUT_FIELDS:
        if isinstance(getattr(out, field, None), torch.Tensor):
            return field
    raise DayzeroError(f"{type(model).__name__} returns none of {', '.join(OUTPUT_FIELDS)}", spec,
                       "return a module whose forward returns the tensors to compile")
