"""Checkpoint folders compiled end to end and checked against the eager model loaded as usual."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import runtime
from compiler.checkpoint import LazyTensor, compile_checkpoint, open_checkpoint
from compiler.cli import main
from compiler.driver import compile
from compiler.frontend import export

from .checkpoint_util import VOCAB, index, logits, save, shards, tiny_gpt2, tiny_llama

pytest.importorskip("transformers")


def _ids(length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def _hf(folder, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """Llama with tied embedding/LM head, in several shards with an index."""
    return save(tiny_llama(tie=True, layers=1), tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def gpt2_bf16_dir(tmp_path_factory):
    return save(tiny_gpt2(layers=1), tmp_path_factory.mktemp("gpt2"), dtype=torch.bfloat16)


def test_sharded_tied_llama_matches_eager_at_two_lengths(llama_dir, tmp_path):
    assert len(shards(llama_dir)) >= 3
    assert "lm_head.weight" not in index(llama_dir)["weight_map"]  # saved once, tied
    ckpt = open_checkpoint(llama_dir)
    out = compile(ckpt.module, ckpt.example_inputs, out=tmp_path / "m.dz", backend="reference",
                  dynamic_shapes=ckpt.dynamic_shapes, checkpoint=ckpt)
    stats = ckpt.reader.stats  # every tensor streamed exactly once, none read whole
    assert stats.tensors == len(ckpt.layout.tensors) and stats.materialized == 0
    assert stats.bytes_read == stats.bytes_written == ckpt.layout.total_bytes
    assert sorted(stats.shards_opened) == ckpt.layout.files
    model, eager = runtime.load(out), _hf(llama_dir)
    for length in (5, 17):
        ids = _ids(length, length)
        np.testing.assert_allclose(model(ids.numpy())[0], logits(eager, ids), atol=1e-5,
                                   rtol=1e-5)
    names = set(model.artifact.weight_locations())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert model.manifest["inputs"] == [{"name": "input_ids", "dtype": "i64",
                                         "shape": [1, "s0"]}]
    assert model.manifest["symbols"] == {"s0": [2, 64]}  # max_position_embeddings


def test_bf16_gpt2_compiles_to_fp32_by_default(gpt2_bf16_dir, tmp_path):
    ckpt = open_checkpoint(gpt2_bf16_dir)
    out = compile(ckpt.module, ckpt.example_inputs, out=tmp_path / "m.dz", backend="reference",
                  dynamic_shapes=ckpt.dynamic_shapes, checkpoint=ckpt)
    stats = ckpt.reader.stats
    assert stats.conversions[("bf16", "f32")] == stats.tensors == len(ckpt.layout.tensors)
    assert stats.bytes_written == 2 * stats.bytes_read == 2 * ckpt.layout.total_bytes
    ids = _ids(9)
    np.testing.assert_allclose(runtime.load(out)(ids.numpy())[0],
                               logits(_hf(gpt2_bf16_dir), ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("make", ["llama", "gpt2"])
def test_bf16_precision_matches_the_bf16_eager_model(make, llama_dir, gpt2_bf16_dir, tmp_path):
    folder = llama_dir if make == "llama" else gpt2_bf16_dir
    out = compile_checkpoint(folder, tmp_path / "m.dz", backend="reference",
                             config={"precision": {"weight_dtype": "bf16",
                                                   "activation_dtype": "bf16"}})
    model = runtime.load(out)
    assert {loc.dtype for loc in model.artifact.weight_locations().values()} >= {"bf16"}
    ids = _ids(12)
    ref32, ref16 = logits(_hf(folder), ids), logits(_hf(folder, torch.bfloat16), ids)
    got = model(ids.numpy())[0]
    scale = np.abs(ref32).max()
    assert np.abs(got - ref16).max() <= 2e-2 * scale  # bf16 rounding, in other places than HF's
    assert np.abs(got - ref32).max() <= 4e-2 * scale


def test_single_file_checkpoint_on_onnxruntime(tmp_path):
    folder = save(tiny_llama(tie=False, layers=1), tmp_path / "ckpt", shard=None)
    assert [p.name for p in shards(folder)] == ["model.safetensors"]
    out = compile_checkpoint(folder, tmp_path / "m.dz", backend="onnxruntime")
    ids = _ids(6)
    np.testing.assert_allclose(runtime.load(out)(ids.numpy())[0], logits(_hf(folder), ids),
                               atol=1e-5, rtol=1e-5)


def test_base_model_checkpoint_loads_into_the_lm_head_model(tmp_path):
    """Hub GPT-2 stores `h.0...` and `wte.weight` (no `transformer.` prefix)."""
    folder = save(tiny_gpt2(base=True), tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(config))
    assert "wte.weight" in index(folder)["weight_map"]
    out = compile_checkpoint(folder, tmp_path / "m.dz", backend="reference")
    ids = _ids(7)
    np.testing.assert_allclose(runtime.load(out)(ids.numpy())[0], logits(_hf(folder), ids),
                               atol=1e-5, rtol=1e-5)


def test_checkpoint_projections_merge_without_being_read(llama_dir, tmp_path):
    """Q/K/V of a streamed checkpoint merge into one linear (lazily stacked, never read whole),
    as they do for a module in memory."""
    ckpt = open_checkpoint(llama_dir)
    out = compile(ckpt.module, ckpt.example_inputs, out=tmp_path / "m.dz", backend="onnxruntime",
                  dynamic_shapes=ckpt.dynamic_shapes, checkpoint=ckpt)
    assert ckpt.reader.stats.materialized == 0
    model = runtime.load(out)
    names = set(model.artifact.weight_locations())
    merged = "model.layers.0.self_attn.q_proj_k_proj_v_proj.weight"
    # stored as the graph has it, or in PackedLinear's panel layout (derived_weights)
    assert merged in names or f"{merged}.panels32" in names, sorted(names)[:8]
    assert "model.layers.0.self_attn.q_proj.weight" not in names
    ids = _ids(9, 3)
    np.testing.assert_allclose(model(ids.numpy())[0], logits(_hf(llama_dir), ids), atol=1e-5,
                               rtol=1e-5)


def test_bound_graph_holds_lazy_handles_in_shard_order(llama_dir):
    ckpt = open_checkpoint(llama_dir)
    graph = ckpt.bind(export(ckpt.module, ckpt.example_inputs,
                             dynamic_shapes=ckpt.dynamic_shapes))
    lazy = [(n, d) for n, d in graph.weight_data.items() if isinstance(d, LazyTensor)]
    assert {n for n, _ in lazy} == set(ckpt.layout.tensors)
    positions = [(ckpt.layout.files.index(d.record.file), d.record.begin) for _, d in lazy]
    assert positions == sorted(positions)
    assert list(graph.weights)[:len(lazy)] == [n for n, _ in lazy]
    assert not isinstance(graph.weight_data["model.rotary_emb.inv_freq"], LazyTensor)
    assert ckpt.reader.stats.bytes_read == 0  # nothing read before the write


def test_cli_compiles_a_checkpoint_folder(llama_dir, tmp_path, capsys):
    out = tmp_path / "m.dz"
    assert main(["compile", str(llama_dir), "-o", str(out), "--backend", "reference",
                 "--seq-len", "4:32", "--task", "forward"]) == 0
    err = capsys.readouterr().err
    assert "LlamaForCausalLM from" in err and "seq in [4, 32]" in err
    assert f"reading shard 1/{len(shards(llama_dir))}" in err
    assert "streamed 11 tensors" in err and "dtype changes: none" in err
    model = runtime.load(out)
    assert model.manifest["symbols"] == {"s0": [4, 32]}
    ids = _ids(4)
    np.testing.assert_allclose(model(ids.numpy())[0], logits(_hf(llama_dir), ids), atol=1e-5,
                               rtol=1e-5)


def test_cli_rejects_a_bad_seq_len(llama_dir, tmp_path, capsys):
    assert main(["compile", str(llama_dir), "-o", str(tmp_path / "m.dz"),
                 "--seq-len", "9:3"]) == 1
    assert "--seq-len '9:3' is an empty range" in capsys.readouterr().err
