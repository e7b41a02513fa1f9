"""Image preprocessing as its own small graph: channel order, resize, rescale, normalize.

What a vision model's processor does before `pixel_values` exist: take an image as decoded
(uint8, height x width x channels, in the decoder's channel order), reorder the channels to the
model's (RGB), resize to the model's resolution (bilinear), scale to [0, 1] and normalize with the
model's mean and std (CLIP's here). Compiled on its own, it feeds examples/llava.py or
examples/vit.py. The image size is dynamic; the output is always [batch, 3, 32, 32].

A wrong channel order (an OpenCV BGR image fed as RGB) or the wrong mean/std gives plausible
numbers and a quietly worse model; `dayzero align` catches both (see
docs/adapting-a-new-model.md):

    dayzero compile examples/preprocess.py:build_bgr -o bgr.dz
    dayzero align examples/preprocess.py:build --artifact bgr.dz
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SIZE = 32
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
CHANNELS = {"rgb": (0, 1, 2), "bgr": (2, 1, 0)}


class Preprocess(nn.Module):
    """uint8 [batch, height, width, 3] in `source` channel order -> float [batch, 3, SIZE, SIZE]."""

    def __init__(self, source: str = "rgb", mean=CLIP_MEAN, std=CLIP_STD, size: int = SIZE):
        super().__init__()
        self.size = size
        # buffers, not Python constants: a preprocessing variant is the same graph with other data
        self.register_buffer("channels", torch.tensor(CHANNELS[source]))
        self.register_buffer("mean", torch.tensor(mean).reshape(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(std).reshape(1, 3, 1, 1))

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = image.permute(0, 3, 1, 2).to(torch.float32)  # NHWC -> NCHW
        x = x.index_select(1, self.channels)  # the decoder's channel order -> RGB
        x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
        x = x / 255.0
        return (x - self.mean) / self.std


def image(height: int = 48, width: int = 40, seed: int = 3) -> torch.Tensor:
    """A random uint8 image [1, height, width, 3]."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (1, height, width, 3), dtype=torch.uint8, generator=generator)


def _spec(model: Preprocess):
    height = torch.export.Dim("height", min=8, max=4096)
    width = torch.export.Dim("width", min=8, max=4096)
    return model.eval(), (image(),), ({1: height, 2: width},)


def build():
    """RGB input, CLIP mean/std: the processor the model was trained with."""
    return _spec(Preprocess("rgb"))


def build_bgr():
    """The same steps on a BGR image (as OpenCV decodes it) without reordering: wrong."""
    return _spec(Preprocess("bgr"))


def build_imagenet_norm():
    """ImageNet's mean/std instead of CLIP's: wrong for this model."""
    return _spec(Preprocess("rgb", mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)))
