"""Broken checkpoint folders: each is one clear error naming the file or the tensor."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from compiler.checkpoint import CheckpointError, compile_checkpoint, open_checkpoint, read_layout
from compiler.ir.weights import WeightOverflowError

from .checkpoint_util import index, read_raw_header, save, shards, tiny_gpt2, write_index, write_raw

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return save(tiny_gpt2(layers=1), tmp_path_factory.mktemp("gpt2"), shard="16KB")


@pytest.fixture
def ckpt(pristine, tmp_path):
    """A fresh copy of a good sharded GPT-2 checkpoint to break."""
    return shutil.copytree(pristine, tmp_path / "ckpt")


def test_the_pristine_copy_is_good(ckpt):
    layout = read_layout(ckpt)
    assert len(layout.files) >= 3 and layout.index == "model.safetensors.index.json"
    assert set(layout.tensors) == set(index(ckpt)["weight_map"])


def test_missing_shard_is_named(ckpt):
    victim = shards(ckpt)[1]
    victim.unlink()
    with pytest.raises(CheckpointError, match=f"missing: {victim.name}") as info:
        read_layout(ckpt)
    assert info.value.where == str(victim)
    assert "download the missing shard" in info.value.fix


def test_index_naming_a_missing_tensor_is_named(ckpt):
    data = index(ckpt)
    data["weight_map"]["transformer.h.0.attn.extra.weight"] = shards(ckpt)[0].name
    write_index(ckpt, data)
    with pytest.raises(CheckpointError, match=r"'transformer\.h\.0\.attn\.extra\.weight' "
                                              r"\(index says model-00001-of-\d+\.safetensors, "
                                              "no shard holds it\\)"):
        read_layout(ckpt)


def test_index_pointing_at_the_wrong_shard(ckpt):
    data = index(ckpt)
    name, file = next(iter(data["weight_map"].items()))
    other = next(p.name for p in shards(ckpt) if p.name != file)
    data["weight_map"][name] = other
    write_index(ckpt, data)
    with pytest.raises(CheckpointError, match=f"'{name}' \\(index says {other}, it is in {file}"):
        read_layout(ckpt)


def test_index_naming_a_file_outside_the_folder(ckpt):
    data = index(ckpt)
    name = next(iter(data["weight_map"]))
    data["weight_map"][name] = "../elsewhere.safetensors"
    write_index(ckpt, data)
    with pytest.raises(CheckpointError, match="names shard '../elsewhere.safetensors', which is "
                                              "not a file in the checkpoint folder"):
        read_layout(ckpt)


def test_truncated_shard_is_named_with_its_last_tensor(ckpt):
    victim = shards(ckpt)[-1]
    blob = victim.read_bytes()
    victim.write_bytes(blob[:-100])
    with pytest.raises(CheckpointError, match=f"shard {victim.name} is truncated") as info:
        read_layout(ckpt)
    assert str(victim) in info.value.where and "tensor '" in info.value.where


def test_header_lying_about_offsets_is_named(ckpt):
    victim = shards(ckpt)[0]
    header, data = read_raw_header(victim)
    name = next(n for n in header if n != "__metadata__")
    begin, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [begin, end + 4]  # claims 4 more bytes than its shape needs
    write_raw(victim, header, data)
    with pytest.raises(CheckpointError, match=f"tensor '{name}'.*header lies about its offsets"):
        read_layout(ckpt)


@pytest.mark.parametrize("b_offsets,size,message", [
    ([8, 24], 24, "places tensor 'b' at offset 8, which overlaps the tensor before it"),
    ([20, 36], 36, "places tensor 'b' at offset 20, which leaves a hole before it"),
    ([16, 32], 40, "has 8 stray bytes after its last tensor"),
])
def test_header_offsets_must_tile_the_file(tmp_path, b_offsets, size, message):
    from compiler.checkpoint.layout import read_header

    path = tmp_path / "model.safetensors"
    header = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
              "b": {"dtype": "F32", "shape": [4], "data_offsets": b_offsets}}
    write_raw(path, header, bytes(size))
    with pytest.raises(CheckpointError, match=message):
        read_header(path, path.name)


def test_header_that_is_not_json(ckpt):
    victim = shards(ckpt)[0]
    blob = bytearray(victim.read_bytes())
    blob[8:12] = b"\xff\xfe{["
    victim.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match=f"shard {victim.name} has a header that is not JSON"):
        read_layout(ckpt)


def test_file_shorter_than_a_header(ckpt):
    shards(ckpt)[0].write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match="too short for a safetensors header"):
        read_layout(ckpt)


def test_config_transformers_does_not_know(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    config["model_type"] = "frobnicator"
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="does not know model_type 'frobnicator'") as info:
        open_checkpoint(ckpt)
    assert info.value.where == str(ckpt / "config.json")
    assert "trust_remote_code" in info.value.fix


def test_config_without_model_type(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    del config["model_type"]
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="config.json has no 'model_type'"):
        open_checkpoint(ckpt)


def test_folder_without_config_or_weights(tmp_path):
    with pytest.raises(CheckpointError, match="has no config.json"):
        read_layout(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match="no model.safetensors and no") as info:
        read_layout(tmp_path)
    assert "pickle" in info.value.fix


def test_every_name_shape_and_dtype_mismatch_in_one_error(tmp_path):
    """Unexpected, missing, wrong shape, wrong dtype: all listed, each with its shard file."""
    from safetensors.torch import save_file

    model = tiny_gpt2(layers=1)
    folder = save(model, tmp_path / "ckpt", shard=None)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    del state["transformer.h.0.mlp.c_fc.bias"]
    state["transformer.h.0.attn.c_proj.weight"] = torch.zeros(5, 5)
    state["transformer.ln_f.weight"] = torch.zeros(32, dtype=torch.int64)
    state["transformer.h.0.adapter.weight"] = torch.zeros(3)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as info:
        open_checkpoint(folder)
    text = str(info.value)
    assert "4 problem(s)" in text
    assert "missing parameter 'transformer.h.0.mlp.c_fc.bias': f32[128], in no shard" in text
    assert ("shape mismatch 'transformer.h.0.attn.c_proj.weight' (model.safetensors): "
            "checkpoint f32[5, 5], model expects f32[32, 32]") in text
    assert ("dtype mismatch 'transformer.ln_f.weight' (model.safetensors): checkpoint i64, "
            "model expects f32") in text
    assert "unexpected tensor 'transformer.h.0.adapter.weight' (model.safetensors)" in text


def test_tied_head_missing_names_both_names(tmp_path):
    from safetensors.torch import save_file

    model = tiny_gpt2(layers=1)
    folder = save(model, tmp_path / "ckpt", shard=None)
    state = {k: v.contiguous() for k, v in model.state_dict().items()
             if k not in ("lm_head.weight", "transformer.wte.weight")}
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="missing parameter 'transformer.wte.weight' "
                                              r"\(tied to 'lm_head.weight'\)"):
        open_checkpoint(folder)


def test_both_tied_copies_stored_is_fine(tmp_path):
    from safetensors.torch import save_file

    model = tiny_gpt2(layers=1)
    folder = save(model, tmp_path / "ckpt", shard=None)
    state = {k: v.clone().contiguous() for k, v in model.state_dict().items()}
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    ckpt = open_checkpoint(folder)
    assert any("tied copies 'lm_head.weight' ignored" in n for n in ckpt.binding.notes)


def test_ignorable_tensors_are_notes_not_errors(tmp_path):
    """GPT-2's stale `attn.bias` masks (model class says so) and Llama's old inv_freq."""
    from safetensors.torch import save_file

    model = tiny_gpt2(layers=1)
    folder = save(model, tmp_path / "ckpt", shard=None)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    state["transformer.h.0.attn.bias"] = torch.ones(1, 1, 64, 64)
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    ckpt = open_checkpoint(folder)
    assert any("'transformer.h.0.attn.bias'" in n for n in ckpt.binding.notes)


def test_fp16_overflow_names_the_weight_and_leaves_no_artifact(tmp_path):
    from safetensors.torch import save_file

    model = tiny_gpt2(layers=1).to(torch.bfloat16)
    folder = save(model, tmp_path / "ckpt", shard=None)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    state["transformer.h.0.mlp.c_fc.weight"][3, 7] = 1e5  # finite in bf16, inf in fp16
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "m.dz"
    with pytest.raises(WeightOverflowError, match=r"weight 'transformer\.h\.0\.mlp\.c_fc\.weight' "
                                                  r"does not fit f16: 1 finite value\(s\)"):
        compile_checkpoint(folder, out, backend="reference",
                           config={"precision": {"weight_dtype": "fp16",
                                                 "activation_dtype": "fp16"}})
    assert not out.exists() and not list(tmp_path.glob(".m.dz*"))


def test_per_expert_names_transformers_does_not_map_are_told_apart_from_a_wrong_config(tmp_path):
    """Mixtral's experts one tensor each, but under names no converter of transformers' table
    reads (`fc1` for `w1`, ...): the config is not wrong, so the error must not say so; it says
    which names transformers stacks for this model and what to do."""
    from safetensors.torch import load_file, save_file
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                           num_local_experts=4)
    MixtralForCausalLM(config).save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    tensors = load_file(path)
    save_file({n.replace(".w1.", ".fc1.").replace(".w2.", ".fc2.").replace(".w3.", ".fc3."): t
               for n, t in tensors.items()}, path)
    with pytest.raises(CheckpointError) as info:
        open_checkpoint(tmp_path)
    text = str(info.value)
    assert "one tensor per expert (12 tensors such as" in text
    assert "experts.0.fc1.weight" in text and "keeps them stacked" in text
    assert "'.experts.*.w1.weight'" in text  # what transformers' mapping reads
    assert "belongs to these weights" not in text
    assert info.value.where == str(path)
    assert "rename the expert tensors" in info.value.fix
