"""A tiny LLaVA-style vision-language model (transformers LlavaForConditionalGeneration).

A CLIP vision tower encodes the image into patch features, a two-layer projector maps them to the
text width, and the model merges them into the token sequence where the prompt holds image
placeholder tokens (`inputs_embeds.masked_scatter(input_ids == image_token_id, features)`, a
data-dependent merge), before a Llama decoder computes the logits. One artifact takes
(input_ids, pixel_values); the text length is dynamic. Weights are random (seeded); nothing is
downloaded.

    dayzero compile examples/llava.py:build -o llava.dz
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

IMAGE_SIZE = 32
PATCH = 8
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2  # the "default" strategy drops the CLS feature
IMAGE_TOKEN_ID = 255  # the last id of the vocabulary stands for one image patch
MAX_SEQ = 256


class VisionLanguageModel(nn.Module):
    """(input_ids, pixel_values) -> logits, with the KV cache off and a plain tensor output."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, pixel_values=pixel_values, use_cache=False,
                          return_dict=True).logits


def config() -> LlavaConfig:
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, image_size=IMAGE_SIZE, patch_size=PATCH,
                              num_channels=3, projection_dim=32)
    text = LlamaConfig(hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                       max_position_embeddings=MAX_SEQ, use_cache=False,
                       tie_word_embeddings=False)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_id=IMAGE_TOKEN_ID,
                      vision_feature_layer=-2, vision_feature_select_strategy="default",
                      projector_hidden_act="gelu", image_seq_length=IMAGE_TOKENS)
    cfg._attn_implementation = "sdpa"
    return cfg


def prompt(text_before: int = 3, text_after: int = 5, seed: int = 1) -> torch.Tensor:
    """input_ids [1, seq]: text tokens, the image placeholders, more text tokens."""
    generator = torch.Generator().manual_seed(seed)
    before = torch.randint(0, IMAGE_TOKEN_ID, (1, text_before), generator=generator)
    after = torch.randint(0, IMAGE_TOKEN_ID, (1, text_after), generator=generator)
    image = torch.full((1, IMAGE_TOKENS), IMAGE_TOKEN_ID, dtype=torch.long)
    return torch.cat([before, image, after], dim=1)


def image(seed: int = 2) -> torch.Tensor:
    """pixel_values [1, 3, 32, 32], already preprocessed (see examples/preprocess.py)."""
    return torch.randn(1, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(seed))


def model() -> VisionLanguageModel:
    torch.manual_seed(0)  # before construction: the random init is the same on every call
    return VisionLanguageModel(LlavaForConditionalGeneration(config()).eval())


def build():
    """CLIP tower (hidden 32, 2 layers, 8x8 patches of a 32x32 image: 16 image tokens),
    projector, Llama decoder (hidden 64, 2 layers); input_ids [1, seq], pixel_values
    [1, 3, 32, 32], seq in [17, 256] with exactly 16 image tokens."""
    seq = torch.export.Dim("seq", min=IMAGE_TOKENS + 1, max=MAX_SEQ)
    return model(), (prompt(), image()), ({1: seq}, None)
