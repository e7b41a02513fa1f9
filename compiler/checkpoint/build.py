"""The transformers model of a checkpoint, built from config.json without allocating its weights.

Parameters are created on the meta device (shapes and dtypes, no storage), so a 70B model builds
in seconds and in megabytes. Buffers are created for real on the CPU, because models compute some
of them at construction time and never save them (rotary `inv_freq`, say); those values are kept
and become weights of the graph. The model is then moved entirely to meta and exported with meta
example inputs: torch.export only needs shapes. No code from the checkpoint folder is ever run
(`trust_remote_code` stays off): a config.json whose architecture the installed transformers does
not know is an error naming the file.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from compiler.ir import DType

from .conversion import conversion_rules
from .layout import CONFIG, CheckpointError, CheckpointLayout
from .verify import Expected, ModelTensors

DEFAULT_SEQ_MAX = 4096
DEFAULT_SEQ_MIN = 2
EXAMPLE_SEQ = 8


@dataclass
class BuiltModel:
    """The meta model and what binding its graph to the checkpoint needs."""

    module: torch.nn.Module
    architecture: str
    tensors: ModelTensors
    buffers: dict[str, torch.Tensor]  # real values computed at construction
    example_inputs: tuple
    dynamic_shapes: Any
    seq_range: tuple[int, int]


def build_model(layout: CheckpointLayout, seq_range: tuple[int, int] | None = None,
                batch: int = 1) -> BuiltModel:
    """Build the model of `layout` on meta, with example token ids and a dynamic sequence dim."""
    config = make_config(layout)
    cls = model_class(config, layout)
    with _params_on_meta(), _no_init():
        try:
            model = cls(config)
        except Exception as exc:
            raise CheckpointError(f"transformers could not build {cls.__name__} from "
                                  f"{CONFIG}: {type(exc).__name__}: {exc}",
                                  str(layout.root / CONFIG), "fix the config values") from exc
    if hasattr(model, "tie_weights"):  # skipped with the weight init; ties are names, not data
        model.tie_weights()
    model.eval()
    model.config.use_cache = False  # one forward over the whole sequence, no KV-cache outputs
    tensors = model_tensors(model)
    buffers = {n: b.detach().clone() for n, b in model.named_buffers(remove_duplicate=False)
               if b.device.type != "meta"}
    model.to("meta")
    _check_forward(model, layout)
    lo, hi = seq_range or default_seq_range(config)
    if not 1 <= lo <= hi:
        raise CheckpointError(f"sequence length range {lo}:{hi} is empty or starts below 1",
                              "--seq-len", "give MIN:MAX with 1 <= MIN <= MAX")
    example = torch.zeros((batch, min(max(EXAMPLE_SEQ, lo), hi)), dtype=torch.long,
                          device="meta")
    dynamic = ({1: torch.export.Dim("seq", min=lo, max=hi)},) if lo < hi else None
    return BuiltModel(model, cls.__name__, tensors, buffers, (example,), dynamic, (lo, hi))


def default_seq_range(config) -> tuple[int, int]:
    """Token ids of shape [1, seq] with seq in [2, min(max_position_embeddings, 4096)]."""
    limit = getattr(config, "max_position_embeddings", None) or DEFAULT_SEQ_MAX
    return DEFAULT_SEQ_MIN, max(DEFAULT_SEQ_MIN, min(int(limit), DEFAULT_SEQ_MAX))


def make_config(layout: CheckpointLayout):
    """The transformers config of config.json; unknown model types name the file."""
    transformers = _transformers()
    data = dict(layout.config)
    model_type = data.pop("model_type", None)
    path = str(layout.root / CONFIG)
    if not isinstance(model_type, str):
        raise CheckpointError(f"{CONFIG} has no 'model_type'", path,
                              "add the model type (e.g. \"llama\") transformers should build")
    try:
        return transformers.AutoConfig.for_model(model_type, **data)
    except Exception as exc:
        known = model_type in transformers.CONFIG_MAPPING
        what = (f"transformers {transformers.__version__} could not read {CONFIG} "
                f"(model_type '{model_type}'): {type(exc).__name__}: {_first_line(exc)}" if known
                else f"transformers {transformers.__version__} does not know model_type "
                     f"'{model_type}' of {CONFIG}")
        fix = ("upgrade transformers (pip install -U transformers), or fix 'model_type'; "
               "models that need trust_remote_code are not built")
        raise CheckpointError(what, path, fix) from exc


def model_class(config, layout: CheckpointLayout):
    """The class config.json's `architectures` names, else the causal LM, else the base model."""
    transformers = _transformers()
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
            return cls
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
        mapping = getattr(auto, "_model_mapping", {})
        if type(config) in mapping:
            return mapping[type(config)]
    raise CheckpointError(f"transformers has no model class for {type(config).__name__} "
                          f"(architectures {getattr(config, 'architectures', None)})",
                          str(layout.root / CONFIG), "check 'architectures' in config.json")


def model_tensors(model: torch.nn.Module) -> ModelTensors:
    """Expected state-dict tensors, tie groups, computed buffers, ignore rules of the model."""
    params = {id(p) for p in model.parameters()}
    expected: dict[str, Expected] = {}
    by_tensor: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        expected[name] = Expected(name, DType.from_torch(tensor.dtype), tuple(tensor.shape),
                                  id(tensor) in params)
        by_tensor.setdefault(id(tensor), []).append(name)
    persistent = set(expected)
    computed = {n for n, _ in model.named_buffers(remove_duplicate=False)} - persistent
    ignore = getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ()
    return ModelTensors(expected, [g for g in by_tensor.values() if len(g) > 1], computed,
                        getattr(model, "base_model_prefix", "") or "", tuple(ignore),
                        legacy_renames(model), conversion_rules(model))


def legacy_renames(model: torch.nn.Module):
    """The name changes transformers applies to this model's checkpoints on load (plain
    renames only, in its order; scoped to the submodule they belong to), or None."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        rules = [r for r in get_model_conversion_mapping(model)
                 if hasattr(r, "rename_source_key") and not getattr(r, "operations", None)]
    except Exception:  # an older transformers, or a model it has no mapping for
        return None
    if not rules:
        return None

    def rename(name: str) -> str:
        for rule in rules:
            name, _ = rule.rename_source_key(name)
        return name
    return rename


@contextlib.contextmanager
def _params_on_meta() -> Iterator[None]:
    """Parameters created inside go to the meta device; buffers stay real (accelerate's trick)."""
    register = torch.nn.Module.register_parameter

    def register_on_meta(module, name, param):
        if param is not None and param.device.type != "meta":
            kwargs = {"requires_grad": param.requires_grad}
            param = type(param)(param.to("meta"), **kwargs)
        register(module, name, param)

    torch.nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def _no_init():
    """transformers' switch that skips weight initialization (pointless for meta parameters)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers: parameters are initialized, then moved to meta
        return contextlib.nullcontext()
    return no_init_weights()


def _check_forward(model: torch.nn.Module, layout: CheckpointLayout) -> None:
    params = list(inspect.signature(model.forward).parameters)
    if "input_ids" not in params[:1]:
        raise CheckpointError(f"{type(model).__name__}.forward takes {params[:1]} first, not "
                              "input_ids", str(layout.root / CONFIG),
                              "only token-id models (text transformers) are built from "
                              "checkpoints; compile other models from a Python SPEC")


def _transformers():
    try:
        import transformers
    except ImportError as exc:
        raise CheckpointError("compiling a checkpoint folder needs transformers", None,
                              "pip install 'dayzero[hf]'") from exc
    return transformers


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
