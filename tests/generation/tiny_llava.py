"""A tiny LLaVA checkpoint folder (transformers' LlavaForConditionalGeneration: a CLIP vision
tower, a projector and a Llama language model, random weights) with a word tokenizer that has an
`<image>` token, a chat template that renders OpenAI-style content parts, and a CLIP image
processor, saved as `save_pretrained` saves them: what `dayzero compile FOLDER` reads."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch

from tests.generation.tiny_lms import WORDS

IMAGE_TOKEN = "<image>"
IMAGE_TOKEN_ID = 255
IMAGE_SIZE = 32
PATCH = 8
IMAGE_TOKENS = (IMAGE_SIZE // PATCH) ** 2  # "default" strategy: the CLS row is dropped
# text parts as they are, an image part as the image token (transformers' convention)
CHAT = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }} : "
        "{% if m['content'] is string %}{{ m['content'] }} {% else %}"
        "{% for p in m['content'] %}{% if p['type'] == 'image' %}<image> "
        "{% else %}{{ p['text'] }} {% endif %}{% endfor %}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}assistant :{% endif %}")


def tiny_llava() -> torch.nn.Module:
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
    )

    torch.manual_seed(0)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, image_size=IMAGE_SIZE, patch_size=PATCH,
                              projection_dim=32)
    text = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                       pad_token_id=0)
    config = LlavaConfig(vision_config=vision, text_config=text,
                         image_token_index=IMAGE_TOKEN_ID, projector_hidden_act="gelu",
                         vision_feature_layer=-2, vision_feature_select_strategy="default",
                         image_seq_length=IMAGE_TOKENS)
    config.bos_token_id, config.eos_token_id, config.pad_token_id = 1, 2, 0
    model = LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():  # random weights large enough that images change the tokens
        for p in model.parameters():
            p.normal_(0, 0.2 if p.dim() > 1 else 0.05)
    model.generation_config.bos_token_id, model.generation_config.eos_token_id = 1, 2
    model.generation_config.pad_token_id = 0
    return model


def tokenizer():
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    vocab.update({f"w{i}": i for i in range(len(vocab), IMAGE_TOKEN_ID)})
    vocab[IMAGE_TOKEN] = IMAGE_TOKEN_ID
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[
        ("<s>", 1)])
    tok.add_special_tokens([AddedToken(IMAGE_TOKEN, special=True, normalized=False)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", chat_template=CHAT,
                                   extra_special_tokens={"image_token": IMAGE_TOKEN})


def image_processor():
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    return CLIPImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                                 crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})


def checkpoint_folder(path: Path) -> torch.nn.Module:
    """Save the tiny LLaVA, its tokenizer and image processor at `path`; returns the model."""
    model = tiny_llava()
    model.save_pretrained(path)
    tokenizer().save_pretrained(path)
    image_processor().save_pretrained(path)
    return model


def image_bytes(fmt: str = "PNG", size: tuple[int, int] = (45, 37), seed: int = 0,
                mode: str = "RGB") -> bytes:
    """An image of random pixels encoded as `fmt` (not square, so resizing and cropping work)."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], len(mode)),
                                                  dtype=np.uint8)
    image = Image.fromarray(pixels if len(mode) > 1 else pixels[..., 0], mode=mode)
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return buf.getvalue()


def compile_folder(root: Path) -> tuple[Path, torch.nn.Module]:
    """The tiny LLaVA folder under `root` compiled as `dayzero compile FOLDER` does (128
    positions); returns the artifact and the transformers model."""
    from compiler.cli import main

    model = checkpoint_folder(root / "ckpt")
    out = root / "llava.dz"
    assert main(["compile", str(root / "ckpt"), "-o", str(out), "--seq-len", "2:128",
                 "-q"]) == 0
    return out, model


def expanded_ids(messages: list, folder: Path) -> list[int]:
    """transformers' ids of chat `messages`: the template rendered, `<image>` expanded to
    IMAGE_TOKENS tokens as LlavaProcessor expands it, then tokenized."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    text = text.replace(IMAGE_TOKEN, IMAGE_TOKEN * IMAGE_TOKENS)
    return tok(text, add_special_tokens=False)["input_ids"]
