"""The runtime's image processor (runtime/generation/images.py) against transformers' PIL-based
CLIP image processor on the same encoded images, and its refusals of hostile input."""

from __future__ import annotations

import io

import numpy as np
import pytest

from compiler.errors import ArtifactError, InputError
from runtime.generation import images
from runtime.generation.images import ImageProcessor
from tests.generation.tiny_llava import image_bytes


def _hf(config: dict):
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    return CLIPImageProcessorPil(**config)


CONFIGS = [
    {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32}},
    {"size": {"shortest_edge": 40}, "crop_size": {"height": 24, "width": 30}, "resample": 2},
    {"size": {"height": 20, "width": 28}, "do_center_crop": False},
    # a crop larger than the resized image: zero padding, as transformers pads
    {"size": {"shortest_edge": 16}, "crop_size": {"height": 30, "width": 18}},
    {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32},
     "do_normalize": False, "rescale_factor": 0.5},
]
IMAGES = [("PNG", (45, 37), "RGB"), ("JPEG", (37, 45), "RGB"), ("PNG", (50, 50), "RGBA"),
          ("PNG", (33, 61), "L"), ("JPEG", (64, 20), "L")]


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
@pytest.mark.parametrize("fmt,size,mode", IMAGES, ids=[f"{f}-{m}-{s[0]}x{s[1]}"
                                                       for f, s, m in IMAGES])
def test_pixels_match_transformers_pil_processor(config, fmt, size, mode):
    from PIL import Image

    data = image_bytes(fmt, size, seed=size[0], mode=mode)
    hf = _hf(config)
    want = hf(Image.open(io.BytesIO(data)), return_tensors="np")["pixel_values"][0]
    # the processor as the artifact records it: the saved preprocessor_config.json
    got = ImageProcessor.from_config(hf.to_dict(), "test")(data)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_output_size_is_the_crop():
    processor = ImageProcessor.from_config(_hf(CONFIGS[1]).to_dict(), "t")
    assert processor.output_size == (24, 30)


@pytest.mark.parametrize("data,message", [
    (b"", "empty"),
    (b"not an image at all", "cannot be decoded"),
    (image_bytes("PNG")[:60], "cannot be decoded"),
    (image_bytes("GIF"), "cannot be decoded as PNG or JPEG"),
])
def test_undecodable_images_are_one_clear_error(data, message):
    processor = ImageProcessor.from_config(_hf(CONFIGS[0]).to_dict(), "t")
    with pytest.raises(InputError, match=message) as info:
        processor(data, "messages[0].content[1].image_url")
    assert info.value.where == "messages[0].content[1].image_url"


def test_a_decompression_bomb_is_refused_before_decoding():
    from PIL import Image

    big = Image.new("1", (10000, 5000))  # 50 M pixels in a few kB of PNG
    buf = io.BytesIO()
    big.save(buf, format="PNG")
    assert len(buf.getvalue()) < 100_000
    with pytest.raises(InputError, match="10000x5000 pixels, more than"):
        images.decode(buf.getvalue(), "image")


def test_limits_apply_to_size_and_bytes(monkeypatch):
    monkeypatch.setattr(images, "MAX_ENCODED_BYTES", 100)
    with pytest.raises(InputError, match="more than 100"):
        images.decode(image_bytes("PNG"), "image")
    monkeypatch.setattr(images, "MAX_ENCODED_BYTES", 1 << 20)
    monkeypatch.setattr(images, "MAX_PIXELS", 1000)
    with pytest.raises(InputError, match="45x37 pixels"):
        images.decode(image_bytes("PNG"), "image")


@pytest.mark.parametrize("config,key", [
    ({"size": {"longest_edge": 3}}, "size"),
    ({"crop_size": {"height": 0, "width": 3}}, "crop_size.height"),
    ({"resample": 9}, "resample"),
    ({"image_std": [1, 0, 1]}, "image_std"),
    ({"image_mean": [1, 2]}, "image_mean"),
    ({"do_resize": "yes"}, "do_resize"),
    ({"do_pad": True}, "do_pad"),
])
def test_a_bad_preprocessor_config_names_the_key(config, key):
    with pytest.raises(ArtifactError) as info:
        ImageProcessor.from_config(config, "m.dz")
    assert info.value.where == f"m.dz: {key}"
