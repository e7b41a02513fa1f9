"""Compiling an image-text (LLaVA-style) model for generation: two graphs in one artifact.

A `*ForConditionalGeneration` model with a vision tower (transformers' Llava family) answers a
prompt whose image tokens stand for an image's patches. Generation splits it where the work
splits:

- the **vision encoder** (vision tower, the configured feature layer and selection strategy,
  projector): pixels [1, 3, H, W] -> image features [1, patches, hidden], run once per image.
  It is compiled as a forward artifact of its own and stored, files and all, under `vision/`
  in the generation artifact (hashed by the outer manifest like every file; the nested
  manifest hashes them too), so the runtime loads it as it loads any artifact;
- the **language model step**, exported from `input_ids` plus `image_embeds` [1, S, hidden]
  and `image_mask` [1, S]: the token embedding of a masked token is replaced by its image
  feature row, as transformers' `masked_scatter` does. Both extra inputs are per token, so
  `derive_generation_step` packs them like `input_ids`: text-only and image requests share a
  step (a text-only step feeds zeros and a false mask).

The manifest's `generation.vision` section names the folder, the image token, how many tokens
an image expands to, the feature width, and the preprocessor config the runtime's image
processor follows (runtime/generation/images.py).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .errors import DayzeroError

IMAGE_EMBEDS = "image_embeds"
IMAGE_MASK = "image_mask"
VISION_DIR = "vision"
PROCESSOR_FILE = "preprocessor_config.json"
_MAX_PROCESSOR_FILE = 1 << 20


def is_image_text(model: Any) -> bool:
    """A Llava-style model: a vision tower, a projector and an image token in its config."""
    inner = getattr(model, "model", None)
    config = getattr(model, "config", None)
    return (hasattr(model, "get_image_features") and hasattr(inner, "vision_tower")
            and hasattr(inner, "multi_modal_projector")
            and getattr(config, "image_token_id", None) is not None)


class LanguageStep(torch.nn.Module):
    """The language model over token embeddings in which image rows replace masked tokens.

    Submodules keep the names they have in the full model (`model.language_model.*`,
    `lm_head.*`), so a checkpoint binds to the exported graph unchanged."""

    def __init__(self, full: torch.nn.Module):
        super().__init__()
        self.model, self.lm_head = full.model, full.lm_head

    def forward(self, input_ids: torch.Tensor, image_embeds: torch.Tensor,
                image_mask: torch.Tensor) -> torch.Tensor:
        embeds = self.model.get_input_embeddings()(input_ids)
        embeds = torch.where(image_mask.unsqueeze(-1), image_embeds.to(embeds.dtype), embeds)
        hidden = self.model.language_model(inputs_embeds=embeds, use_cache=False,
                                           return_dict=True).last_hidden_state
        return self.lm_head(hidden)


class VisionTower(torch.nn.Module):
    """pixels -> projected image features, with the feature layer and strategy of the config."""

    def __init__(self, full: torch.nn.Module):
        super().__init__()
        self.model = full.model
        config = full.config
        self.layer = config.vision_feature_layer
        self.strategy = config.vision_feature_select_strategy

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        out = self.model.get_image_features(pixel_values=pixel_values,
                                            vision_feature_layer=self.layer,
                                            vision_feature_select_strategy=self.strategy,
                                            output_hidden_states=True, return_dict=True)
        return torch.stack(list(out.pooler_output))


def processor_config(folder: str | Path | None) -> dict[str, Any]:
    """The checkpoint's preprocessor_config.json, read as data and checked for the keys the
    runtime's image processor follows."""
    path = Path(folder) / PROCESSOR_FILE if folder is not None else None
    if path is None or not path.is_file():
        raise DayzeroError(f"an image-text model needs its image processor's {PROCESSOR_FILE}",
                           str(path or "checkpoint folder"),
                           "save the processor next to the weights "
                           "(CLIPImageProcessor.save_pretrained(FOLDER)), or compile with "
                           "--task forward")
    if path.stat().st_size > _MAX_PROCESSOR_FILE:
        raise DayzeroError(f"{PROCESSOR_FILE} is larger than 1 MiB", str(path),
                           "check the checkpoint's image processor file")
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise DayzeroError(f"{PROCESSOR_FILE} is not JSON: {exc}", str(path),
                           "save the processor again with save_pretrained") from None
    from runtime.generation.images import ImageProcessor

    ImageProcessor.from_config(data, str(path))  # refuse now what the runtime would refuse
    return data


def example_inputs(full: torch.nn.Module, ids: torch.Tensor, processor: dict[str, Any]):
    """Example inputs of the two graphs: the step's (ids, image rows, mask) and the encoder's
    pixels (one image of the crop size the processor produces)."""
    from runtime.generation.images import ImageProcessor

    hidden = full.config.text_config.hidden_size
    dtype = full.lm_head.weight.dtype
    rows = torch.zeros((*ids.shape, hidden), dtype=dtype, device=ids.device)
    mask = torch.zeros(ids.shape, dtype=torch.bool, device=ids.device)
    height, width = ImageProcessor.from_config(processor, PROCESSOR_FILE).output_size
    pixels = torch.zeros((1, 3, height, width), dtype=full.model.vision_tower.dtype,
                         device=ids.device)
    return (ids, rows, mask), (pixels,)


def compile_vision(compile: Callable[..., Path], full: torch.nn.Module, pixels: torch.Tensor,
                   backend: str, config: Any, checkpoint: Any, log: Any
                   ) -> tuple[dict[str, bytes], list[int]]:
    """The vision encoder compiled (by the driver's `compile`) as a forward artifact: its
    files under `vision/`, and its output shape [1, patches, hidden]."""
    with tempfile.TemporaryDirectory(prefix="dayzero-vision-") as tmp:
        path = compile(VisionTower(full).eval(), (pixels,), out=Path(tmp) / "vision.dz",
                       backend=backend, config=config, checkpoint=checkpoint, log=log)
        if checkpoint is not None:  # the language step streams the shards afresh
            checkpoint.reader.stats = type(checkpoint.reader.stats)()
        manifest = json.loads((path / "manifest.json").read_text())
        files = {f"{VISION_DIR}/{p.relative_to(path).as_posix()}": p.read_bytes()
                 for p in sorted(path.rglob("*")) if p.is_file()}
    shape = manifest["outputs"][0]["shape"]
    if len(shape) != 3 or not all(isinstance(d, int) for d in shape):
        raise DayzeroError(f"the vision encoder returns features of shape {shape}, not a static "
                           "[1, patches, hidden]", "task text-generation",
                           "report the model: its image features have a dynamic size")
    return files, shape


def vision_section(full: torch.nn.Module, shape: list[int], processor: dict[str, Any]
                   ) -> dict[str, Any]:
    config = full.config
    hidden = config.text_config.hidden_size
    if shape[2] != hidden:
        raise DayzeroError(f"the projector returns rows of width {shape[2]}, the language "
                           f"model embeds {hidden}", "config.json: projector",
                           "check the checkpoint's config")
    return {"artifact": VISION_DIR, "image_token_id": int(config.image_token_id),
            "image_tokens": int(shape[1]), "hidden_size": int(hidden),
            "processor": processor}


def generation_dynamic_shapes(dynamic_shapes: Any) -> Any:
    """The step's dynamic shapes: the sequence dim of `input_ids` shared by the image rows
    and the mask."""
    if not isinstance(dynamic_shapes, (tuple, list)) or not dynamic_shapes \
            or not isinstance(dynamic_shapes[0], dict) or 1 not in dynamic_shapes[0]:
        raise DayzeroError("an image-text model needs a dynamic sequence dim on input_ids",
                           "dynamic_shapes", "compile the checkpoint with --seq-len MIN:MAX")
    seq = dynamic_shapes[0][1]
    return ({1: seq}, {1: seq}, {1: seq})


def prepare(compile: Callable[..., Path], full: torch.nn.Module, example: tuple,
            dynamic_shapes: Any, *, backend: str, config: Any, checkpoint: Any, log: Any,
            folder: str | Path | None):
    """Compile the vision encoder; return what the language step is compiled from: the
    module, its example inputs and dynamic shapes, the vision files and manifest section."""
    processor = processor_config(folder)
    step_inputs, vision_inputs = example_inputs(full, example[0], processor)
    dynamic = generation_dynamic_shapes(dynamic_shapes)
    with log.stage("vision encoder", f"{type(full.model.vision_tower).__name__} + projector"):
        files, shape = compile_vision(compile, full, *vision_inputs, backend, config,
                                      checkpoint, log)
    return LanguageStep(full).eval(), step_inputs, dynamic, files, \
        vision_section(full, shape, processor)
