"""Images in generation: the vision encoder of an image-text artifact and where its features go.

An image-text artifact (compiler/image_text.py) holds a vision encoder (a forward artifact in
`vision/`: pixels [1, 3, H, W] -> features [1, image_tokens, hidden]) beside the language
model's step, which takes per token `image_embeds` rows and an `image_mask`. A prompt stands
for each image with `image_tokens` copies of the image token (transformers' processor expands
the one `<image>` of the chat template the same way); the encoder runs once per image, and
`ImageRows` keeps its features by prompt position, so every step (and a preempted sequence's
recompute) feeds the rows of the tokens it packs. A sequence without images feeds zeros and a
false mask, so text-only and image requests share one step.
"""

from __future__ import annotations

import base64
import binascii
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.errors import ArtifactError, InputError

from ..to_numpy import to_numpy
from .images import MAX_ENCODED_BYTES, ImageProcessor
from .step import StepPart

IMAGE_INPUTS = ("image_embeds", "image_mask")
_DATA_URL = re.compile(r"data:image/(png|jpeg|jpg);base64,(.*)", re.DOTALL | re.IGNORECASE)
_MAX_IMAGES = 64


@dataclass(frozen=True)
class ImageRows:
    """A prompt's image features by token position: `positions` [k] ascending, `rows` [k, H]."""
    positions: np.ndarray
    rows: np.ndarray

    def window(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Mask [count] of the image tokens among positions start .. start + count - 1, and
        their rows in order."""
        lo, hi = np.searchsorted(self.positions, [start, start + count])
        mask = np.zeros(count, bool)
        mask[self.positions[lo:hi] - start] = True
        return mask, self.rows[lo:hi]


def image_feeds(parts: Sequence[StepPart], hidden: int, dtype: Any = np.float32
                ) -> dict[str, np.ndarray]:
    """`image_embeds` [1, T, hidden] and `image_mask` [1, T] of a step packing `parts`."""
    total = sum(len(p.tokens) for p in parts)
    rows = np.zeros((1, total, hidden), dtype)
    mask = np.zeros((1, total), bool)
    offset = 0
    for part in parts:
        n = len(part.tokens)
        if part.images is not None:
            where, values = part.images.window(part.start, n)
            mask[0, offset:offset + n] = where
            rows[0, offset:offset + n][where] = values
        offset += n
    return {"image_embeds": rows, "image_mask": mask}


class ImageEncoder:
    """The artifact's vision encoder and image processor, and the prompt's image tokens."""

    def __init__(self, step_model, section: Any):
        where = f"{step_model.path}: generation.vision"
        if not isinstance(section, Mapping) or not isinstance(section.get("artifact"), str) \
                or not re.fullmatch(r"[A-Za-z0-9_.-]+", section["artifact"]) \
                or section["artifact"] in (".", ".."):
            raise ArtifactError("manifest.json: generation.vision is invalid", where,
                                "the artifact is corrupted; recompile it")
        for key in ("image_token_id", "image_tokens", "hidden_size"):
            value = section.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 31:
                raise ArtifactError(f"manifest.json: generation.vision.{key} is invalid",
                                    where, "the artifact is corrupted; recompile it")
        self.image_token_id = section["image_token_id"]
        self.image_tokens = section["image_tokens"]
        self.hidden = section["hidden_size"]
        self.processor = ImageProcessor.from_config(section.get("processor"),
                                                    f"{where}.processor")
        self.path = step_model.path / section["artifact"]
        self._model = None
        self._lock = threading.Lock()  # a server encodes images on several threads

    @property
    def model(self):
        with self._lock:
            if self._model is None:  # loaded at the first image
                from ..model import load

                self._model = load(self.path)
        return self._model

    def pixels(self, image: Any, field: str) -> np.ndarray:
        """[3, H, W] pixel values of `image`: encoded bytes, or pixel values already made."""
        if isinstance(image, (bytes, bytearray)):
            return self.processor(bytes(image), field)
        array = np.asarray(to_numpy(image))
        want = (3, *self.processor.output_size)
        if array.shape != want or array.dtype.kind != "f":
            raise InputError(f"{field} is {array.dtype}{list(array.shape)}, not float pixel "
                             f"values {list(want)} nor the bytes of a PNG or JPEG image",
                             field, "pass encoded image bytes, or the image processor's "
                             "pixel_values")
        return array.astype(np.float32)

    def features(self, images: Sequence[Any], field: str = "images") -> list[np.ndarray]:
        """[image_tokens, hidden] features of each image, the encoder run once per image."""
        if len(images) > _MAX_IMAGES:
            raise InputError(f"{len(images)} images in one request, more than {_MAX_IMAGES}",
                             field, "send fewer images")
        pixels = [self.pixels(image, f"{field}[{i}]") for i, image in enumerate(images)]
        return [self.model(p[None])[0].reshape(self.image_tokens, self.hidden) for p in pixels]

    def expand(self, ids: Sequence[int]) -> list[int]:
        """Each image token of a rendered prompt as `image_tokens` copies, as transformers'
        processor expands it."""
        out: list[int] = []
        for token in ids:
            out.extend([token] * self.image_tokens if token == self.image_token_id else [token])
        return out

    def place(self, rows_of_ids: Sequence[Sequence[int]], features: Sequence[np.ndarray],
              field: str = "input_ids") -> list[ImageRows | None]:
        """The features of the images in order over the image tokens of the prompts in order
        (as transformers' masked_scatter places them); the counts must agree."""
        positions = [np.flatnonzero(np.asarray(ids) == self.image_token_id) for ids in rows_of_ids]
        have = sum(len(p) for p in positions)
        if have != len(features) * self.image_tokens:
            raise InputError(f"the prompts hold {have} image tokens (id {self.image_token_id}), "
                             f"but {len(features)} image(s) need {self.image_tokens} each",
                             field, "put one image token per image in the prompt (generate_text "
                             "with image parts does), expanded to "
                             f"{self.image_tokens} tokens when passing ids")
        rows = np.concatenate(features) if features else np.zeros((0, self.hidden), np.float32)
        out, taken = [], 0
        for where in positions:
            out.append(ImageRows(where.astype(np.int64), rows[taken:taken + len(where)])
                       if len(where) else None)
            taken += len(where)
        return out


def split_messages(messages: Any) -> tuple[Any, list[bytes], list[str]]:
    """OpenAI chat messages with `image_url` parts -> the messages a chat template renders
    (an image part as `{"type": "image"}`), the images' bytes and each image's field name.
    Messages without images come back as they are."""
    if not isinstance(messages, (list, tuple)):
        return messages, [], []
    out, images, fields = [], [], []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            field = f"messages[{i}].content[{j}]"
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind == "image_url":
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, Mapping) else url
                images.append(decode_data_url(url, f"{field}.image_url.url"))
                fields.append(f"{field}.image_url")
                parts.append({"type": "image"})
            elif kind == "image" and isinstance(part.get("image"), (bytes, bytearray)):
                images.append(bytes(part["image"]))
                fields.append(f"{field}.image")
                parts.append({"type": "image"})
            elif kind == "text" and isinstance(part.get("text"), str):
                parts.append({"type": "text", "text": part["text"]})
            else:
                raise InputError(f"{field} is not a text, image_url or image part", field,
                                 "write {'type': 'text', 'text': ...} or {'type': 'image_url', "
                                 "'image_url': {'url': 'data:image/png;base64,...'}}")
        out.append({**message, "content": parts})
    return out, images, fields


def decode_data_url(url: Any, field: str) -> bytes:
    """The bytes of a `data:image/png;base64,...` (or image/jpeg) URL; nothing is fetched."""
    match = _DATA_URL.fullmatch(url.strip()) if isinstance(url, str) else None
    if match is None:
        shown = url[:40] if isinstance(url, str) else type(url).__name__
        raise InputError(f"{field} is not a base64 data URL of a PNG or JPEG image "
                         f"({shown!r}...)", field,
                         "send data:image/png;base64,... or data:image/jpeg;base64,...; "
                         "the server fetches no URLs")
    if len(match.group(2)) > MAX_ENCODED_BYTES * 4 // 3 + 4:
        raise InputError(f"{field} holds more than {MAX_ENCODED_BYTES} bytes of image", field,
                         "send a smaller image")
    try:
        return base64.b64decode(match.group(2), validate=True)
    except (binascii.Error, ValueError):
        raise InputError(f"{field} has invalid base64 data", field,
                         "encode the image bytes with standard base64") from None
