"""Small Hugging Face checkpoints with random weights, written the way transformers writes them."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

VOCAB = 96


def tiny_llama(tie: bool = True, layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=tie,
                         bos_token_id=0, eos_token_id=1, pad_token_id=None)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def tiny_gpt2(layers: int = 2, base: bool = False):
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=layers, n_head=4, n_positions=64,
                        bos_token_id=0, eos_token_id=0)
    torch.manual_seed(1)
    return (GPT2Model if base else GPT2LMHeadModel)(config).eval()


def save(model, folder: Path, shard: str | None = "24KB", dtype: torch.dtype | None = None
         ) -> Path:
    """save_pretrained into `folder`: several shards and an index, or one file (shard=None)."""
    if dtype is not None:
        model = model.to(dtype)
    kwargs = {"max_shard_size": shard} if shard else {"max_shard_size": "10GB"}
    model.save_pretrained(folder, **kwargs)
    return folder


def shards(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def index(folder: Path) -> dict:
    return json.loads((folder / "model.safetensors.index.json").read_text())


def write_index(folder: Path, data: dict) -> None:
    (folder / "model.safetensors.index.json").write_text(json.dumps(data))


def read_raw_header(path: Path) -> tuple[dict, bytes]:
    """(header dict, data bytes) of a safetensors file."""
    blob = path.read_bytes()
    (length,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + length]), blob[8 + length:]


def write_raw(path: Path, header: dict, data: bytes) -> None:
    """A safetensors file with exactly this header (which may lie) and data."""
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def logits(model, ids: torch.Tensor):
    with torch.no_grad():
        return model(ids).logits.float().numpy()
