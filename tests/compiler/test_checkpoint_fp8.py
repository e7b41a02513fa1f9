"""Block-scaled FP8 checkpoints (DeepSeek-V3's release layout: float8_e4m3fn weights with a
`weight_scale_inv` per block, `quantization_config.weight_block_size`) stream dequantized.

The folders are written here: a dense Llama and a DeepSeek-V3 in the Hub's per-expert layout,
their linear weights quantized to fp8 in blocks of 16 x 16 (rows and columns that are not
multiples of the block included). The compiled artifact must match eager run on exactly the
dequantized weights (fp8 value times its block's scale_inv)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import runtime
from compiler.checkpoint import CheckpointError, compile_checkpoint, open_checkpoint
from compiler.ir import DType

from .checkpoint_util import logits, save, tiny_llama
from .test_checkpoint_moe import _ids, hub_layout, tiny_moe

BLOCK = 16
pytest.importorskip("transformers")


def quantized(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 codes, scale_inv [ceil(rows / 16), ceil(cols / 16)]) with each block's largest
    magnitude at fp8's largest finite value, 448."""
    rows, cols = weight.shape
    padded = torch.zeros(-(-rows // BLOCK) * BLOCK, -(-cols // BLOCK) * BLOCK)
    padded[:rows, :cols] = weight
    blocks = padded.reshape(padded.shape[0] // BLOCK, BLOCK, -1, BLOCK)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / 448.0
    full = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:rows, :cols]
    return (weight / full).to(torch.float8_e4m3fn), scale


def dequantized(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    rows, cols = codes.shape
    full = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:rows, :cols]
    return codes.float() * full


def to_fp8(folder) -> dict[str, torch.Tensor]:
    """Quantize every 2-d weight of the decoder layers in place in `folder`'s shards (as the
    release does: attention and MLP/expert projections, not norms, embeddings or routers);
    returns the dequantized values, which the model is then given."""
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else None
    values = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors = load_file(shard)
        for name in list(tensors):
            t = tensors[name]
            if ".layers." in name and name.endswith("proj.weight") or ".experts." in name \
                    and t.dim() == 2:
                codes, scale = quantized(t.float())
                tensors[name], tensors[name + "_scale_inv"] = codes, scale
                values[name] = dequantized(codes, scale)
                if index is not None:
                    index["weight_map"][name + "_scale_inv"] = shard.name
        save_file(tensors, shard)
    if index is not None:
        index_path.write_text(json.dumps(index))
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3",
                                     "activation_scheme": "dynamic",
                                     "weight_block_size": [BLOCK, BLOCK]}
    (folder / "config.json").write_text(json.dumps(config))
    return values


def test_a_dense_fp8_checkpoint_matches_eager_on_the_dequantized_weights(tmp_path):
    model = tiny_llama(tie=False)
    folder = save(model, tmp_path / "ckpt")
    values = to_fp8(folder)
    model.load_state_dict(values, strict=False)
    ckpt = open_checkpoint(folder)
    assert not any(n.endswith("_scale_inv") for n in ckpt.layout.tensors)
    assert {r.stored for r in ckpt.layout.tensors.values() if r.scale is not None} == \
        {DType.f8e4m3}
    out = compile_checkpoint(folder, tmp_path / "m.dz")
    for length in (3, 9):
        ids = _ids(length, length)
        np.testing.assert_allclose(runtime.load(out)(ids.numpy())[0], logits(model, ids),
                                   atol=1e-5, rtol=1e-5)


def test_per_expert_fp8_tensors_stack_dequantized(tmp_path):
    model = tiny_moe("deepseek_v3", moe_intermediate_size=24)  # 24: not a multiple of 16
    folder = hub_layout(model, "deepseek_v3", tmp_path / "ckpt")
    values = to_fp8(folder)
    assert any(".experts.3." in n for n in values)
    state = model.state_dict()
    for name in [n for n in state if n.endswith((".experts.gate_up_proj", ".experts.down_proj"))]:
        stem = name.rsplit(".experts.", 1)[0] + ".experts"
        stacked = []
        for e in range(state[name].shape[0]):
            if name.endswith("gate_up_proj"):
                stacked.append(torch.cat([values[f"{stem}.{e}.gate_proj.weight"],
                                          values[f"{stem}.{e}.up_proj.weight"]]))
            else:
                stacked.append(values[f"{stem}.{e}.down_proj.weight"])
        values[name] = torch.stack(stacked)
    model.load_state_dict({k: v for k, v in values.items() if k in state}, strict=False)
    out = compile_checkpoint(folder, tmp_path / "m.dz", backend="reference")
    for length in (5, 11):
        ids = _ids(length, length)
        np.testing.assert_allclose(runtime.load(out)(ids.numpy())[0], logits(model, ids),
                                   atol=1e-5, rtol=1e-5)


def test_scales_of_the_wrong_shape_are_named(tmp_path):
    folder = save(tiny_llama(tie=False), tmp_path / "ckpt")
    to_fp8(folder)
    shard = sorted(folder.glob("*.safetensors"))[0]
    tensors = load_file(shard)
    name = next(n for n in tensors if n.endswith("_scale_inv"))
    tensors[name] = torch.ones(1, 1)
    save_file(tensors, shard)
    with pytest.raises(CheckpointError, match=f"has scales '{name}' f32\\[1, 1\\]; blocks of "
                                              "\\[16, 16\\] need float"):
        open_checkpoint(folder)
