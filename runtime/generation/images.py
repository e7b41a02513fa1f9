"""The image processor of an image-text artifact: bytes of a PNG or JPEG -> pixel values.

It follows the checkpoint's preprocessor_config.json (recorded in the manifest) step by step as
transformers' PIL-based CLIP image processor does, so that the same image gives the same
pixels: decode, convert to RGB (transparency composited onto white), resize with Pillow
(the shortest edge to `size.shortest_edge`, or to `size.height` x `size.width`, with the
config's `resample` filter), center-crop to `crop_size` (zero-padded when smaller), rescale
in float64 then cast to float32, and normalise per channel in float32.

Images come from clients: the encoded size, the pixel count (Pillow's decompression-bomb
guard, raised to an error at our own limit) and the formats (PNG and JPEG only) are bounded
before any pixel is decoded, and every failure is one `InputError` naming the field.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.errors import ArtifactError, InputError

FORMATS = ("PNG", "JPEG")
MAX_ENCODED_BYTES = 20 << 20
MAX_PIXELS = 40_000_000      # width x height of a decoded image
MAX_SIDE = 16384
_RESAMPLE = {0: "NEAREST", 1: "LANCZOS", 2: "BILINEAR", 3: "BICUBIC", 4: "BOX", 5: "HAMMING"}
_MAX_TARGET = 8192


@dataclass(frozen=True)
class ImageProcessor:
    do_convert_rgb: bool
    do_resize: bool
    size: tuple[str, int, int]          # ("shortest_edge", n, 0) or ("height_width", h, w)
    resample: int
    do_center_crop: bool
    crop_size: tuple[int, int]
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]

    @classmethod
    def from_config(cls, config: Any, where: str) -> ImageProcessor:
        """Read a preprocessor config as untrusted data; a key out of bounds, or a step this
        processor does not perform, is an error naming the key."""
        if not isinstance(config, Mapping):
            raise _bad(where, "(file)", "is not a JSON object")
        unsupported = [k for k in ("do_pad", "do_image_splitting") if config.get(k)]
        if unsupported:
            raise _bad(where, unsupported[0], "asks for a step this image processor does not "
                       "perform")
        crop = config.get("crop_size", {"height": 224, "width": 224})
        if isinstance(crop, int) and not isinstance(crop, bool):
            crop = {"height": crop, "width": crop}
        return cls(
            _flag(config, "do_convert_rgb", True, where), _flag(config, "do_resize", True, where),
            _size(config.get("size", {"shortest_edge": 224}), where),
            _resample(config.get("resample", 3), where),
            _flag(config, "do_center_crop", True, where),
            (_side(crop, "height", where, "crop_size"), _side(crop, "width", where, "crop_size")),
            _flag(config, "do_rescale", True, where),
            _number(config.get("rescale_factor", 1 / 255), where, "rescale_factor"),
            _flag(config, "do_normalize", True, where),
            _triple(config.get("image_mean", [0.48145466, 0.4578275, 0.40821073]), where,
                    "image_mean"),
            _triple(config.get("image_std", [0.26862954, 0.26130258, 0.27577711]), where,
                    "image_std", positive=True))

    @property
    def output_size(self) -> tuple[int, int]:
        """(height, width) of the pixels of every image (the crop; else a fixed resize)."""
        if self.do_center_crop:
            return self.crop_size
        if self.do_resize and self.size[0] == "height_width":
            return self.size[1], self.size[2]
        raise ArtifactError("the image processor gives images of varying size (no center "
                            "crop and no fixed resize); the vision encoder takes one size",
                            "preprocessor_config.json: crop_size",
                            "set do_center_crop with a crop_size, or size height and width")

    def __call__(self, data: bytes, field: str = "image") -> np.ndarray:
        """Pixel values [3, height, width] float32 of the encoded image `data`."""
        image = decode(data, field)
        if self.do_convert_rgb:
            image = to_rgb(image)
        pixels = np.asarray(image)
        if pixels.ndim == 2:
            pixels = pixels[..., None]
        if pixels.ndim != 3 or pixels.shape[-1] != 3:
            raise InputError(f"the image has {pixels.shape[-1] if pixels.ndim == 3 else 1} "
                             f"channel(s) ({image.mode}), not 3", field, "send an RGB image")
        if self.do_resize:
            pixels = self._resize(image if self.do_convert_rgb else pixels)
        chw = np.moveaxis(pixels, -1, 0)
        if self.do_center_crop:
            chw = center_crop(chw, self.crop_size)
        if self.do_rescale:
            chw = (chw.astype(np.float64) * self.rescale_factor).astype(np.float32)
        if self.do_normalize:
            chw = chw.astype(np.float32) if chw.dtype.kind != "f" else chw
            mean = np.asarray(self.image_mean, chw.dtype)[:, None, None]
            std = np.asarray(self.image_std, chw.dtype)[:, None, None]
            chw = (chw - mean) / std
        return np.ascontiguousarray(chw, dtype=np.float32)

    def _resize(self, image: Any) -> np.ndarray:
        from PIL import Image

        if isinstance(image, np.ndarray):
            image = Image.fromarray(image)
        width, height = image.size
        kind, a, b = self.size
        if kind == "height_width":
            new_h, new_w = a, b
        else:  # transformers' get_resize_output_image_size(default_to_square=False)
            short, long = (width, height) if width <= height else (height, width)
            new_short, new_long = a, int(a * long / short)
            new_h, new_w = (new_long, new_short) if width <= height else (new_short, new_long)
        if max(new_h, new_w) > MAX_SIDE:
            raise InputError(f"the image's aspect ratio ({width}x{height}) resizes to "
                             f"{new_w}x{new_h}, more than {MAX_SIDE} pixels on a side",
                             "image", "send an image closer to square")
        resample = getattr(Image.Resampling, _RESAMPLE[self.resample])
        return np.asarray(image.resize((new_w, new_h), resample=resample))


def decode(data: bytes, field: str = "image") -> Any:
    """The PIL image of `data` (PNG or JPEG), refused before decoding when too large."""
    from PIL import Image

    if not isinstance(data, (bytes, bytearray)) or not data:
        raise InputError("the image is empty", field, "send the bytes of a PNG or JPEG image")
    if len(data) > MAX_ENCODED_BYTES:
        raise InputError(f"the image is {len(data)} bytes, more than {MAX_ENCODED_BYTES}",
                         field, "send a smaller image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(bytes(data)), formats=FORMATS)
            width, height = image.size
            if width * height > MAX_PIXELS or max(width, height) > MAX_SIDE:
                raise InputError(f"the image is {width}x{height} pixels, more than "
                                 f"{MAX_PIXELS} pixels or {MAX_SIDE} on a side", field,
                                 "send a smaller image")
            image.load()
    except InputError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InputError("the image declares more pixels than it may decode to (a "
                         "decompression bomb?)", field, "send a smaller image") from None
    except Exception as exc:  # Pillow raises many kinds for broken data
        raise InputError(f"the image cannot be decoded as PNG or JPEG: {exc}", field,
                         "send a valid PNG or JPEG image") from None
    return image


def to_rgb(image: Any) -> Any:
    """RGB, transparency composited onto white (as transformers' convert_to_rgb)."""
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        image = image.convert("RGBA")
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image).convert("RGB")
    return image.convert("RGB")


def center_crop(chw: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The centre `size` of [C, H, W], zero-padded where the image is smaller (transformers'
    center_crop, offsets rounded the same way)."""
    height, width = chw.shape[-2:]
    crop_h, crop_w = size
    top, left = (height - crop_h) // 2, (width - crop_w) // 2
    if top >= 0 and left >= 0:
        return chw[:, top:top + crop_h, left:left + crop_w]
    new_h, new_w = max(crop_h, height), max(crop_w, width)
    padded = np.zeros((chw.shape[0], new_h, new_w), chw.dtype)
    pad_top, pad_left = -(-(new_h - height) // 2), -(-(new_w - width) // 2)
    padded[:, pad_top:pad_top + height, pad_left:pad_left + width] = chw
    top, left = top + pad_top, left + pad_left
    return padded[:, max(0, top):min(new_h, top + crop_h), max(0, left):min(new_w, left + crop_w)]


def _bad(where: str, key: str, what: str) -> ArtifactError:
    return ArtifactError(f"preprocessor config: {key} {what}", f"{where}: {key}",
                         "fix the checkpoint's preprocessor_config.json and recompile")


def _flag(config: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise _bad(where, key, f"is {value!r}, not true or false")
    return value


def _side(mapping: Any, key: str, where: str, parent: str) -> int:
    value = mapping.get(key) if isinstance(mapping, Mapping) else None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= _MAX_TARGET:
        raise _bad(where, f"{parent}.{key}", f"is {value!r}, not a size in [1, {_MAX_TARGET}]")
    return value


def _size(size: Any, where: str) -> tuple[str, int, int]:
    if isinstance(size, Mapping) and set(size) == {"shortest_edge"}:
        return "shortest_edge", _side(size, "shortest_edge", where, "size"), 0
    if isinstance(size, Mapping) and set(size) == {"height", "width"}:
        return "height_width", _side(size, "height", where, "size"), \
            _side(size, "width", where, "size")
    raise _bad(where, "size", f"is {size!r}; this processor resizes to "
               "{shortest_edge} or {height, width}")


def _resample(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value not in _RESAMPLE:
        raise _bad(where, "resample", f"is {value!r}, not a Pillow filter 0-5")
    return value


def _number(value: Any, where: str, key: str, positive: bool = False) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) \
            or not np.isfinite(value) or (positive and value <= 0):
        raise _bad(where, key, f"is {value!r}, not a finite{' positive' if positive else ''} "
                   "number")
    return float(value)


def _triple(value: Any, where: str, key: str, positive: bool = False
            ) -> tuple[float, float, float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value] * 3
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise _bad(where, key, f"is {value!r}, not three numbers (one per channel)")
    a, b, c = (_number(v, where, key, positive) for v in value)
    return a, b, c
