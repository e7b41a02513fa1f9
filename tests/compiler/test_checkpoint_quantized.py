"""A streamed checkpoint quantized to int4 while it is written: the same codes as quantizing the
model in memory, each source weight read a slice of rows at a time, never whole."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import runtime
from compiler.checkpoint import compile_checkpoint, open_checkpoint
from compiler.checkpoint.lazy_quantized import LazyQuantized
from compiler.driver import compile

from .checkpoint_util import VOCAB, save, tiny_llama

pytest.importorskip("transformers")
CONFIG = {"quantize": {"weights": "int4", "group_size": 16}}


def test_checkpoint_quantized_while_streamed_matches_in_memory(tmp_path):
    folder = save(tiny_llama(tie=False, layers=1), tmp_path / "llama")
    ckpt = open_checkpoint(folder)
    streamed = compile(ckpt.module, ckpt.example_inputs, out=tmp_path / "ckpt.dz",
                       backend="reference", dynamic_shapes=ckpt.dynamic_shapes, config=CONFIG,
                       checkpoint=ckpt)
    stats = ckpt.reader.stats
    quantized = [n for n in runtime.load(streamed).artifact.weight_locations() if ".q4" in n]
    # each source quantized by one job, a slice at a time: none read whole
    assert quantized and stats.quantized == len(quantized) and stats.materialized == 0
    model = tiny_llama(tie=False, layers=1)
    model.config.use_cache = False
    in_memory = compile_checkpoint(folder, tmp_path / "ckpt2.dz", backend="onnxruntime",
                                   config=CONFIG)
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(0))
    reference = compile(model, (ids,), out=tmp_path / "mem.dz", backend="reference",
                        config=CONFIG)
    want = runtime.load(reference)(ids.numpy())[0]
    np.testing.assert_allclose(runtime.load(streamed)(ids.numpy())[0], want, rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(runtime.load(in_memory)(ids.numpy())[0], want, rtol=1e-5,
                               atol=1e-5)


def test_one_quantization_serves_both_handles(tmp_path):
    from compiler.checkpoint.lazy_quantized import QuantizeJob
    from passes.quantize_weights import quantize

    folder = save(tiny_llama(tie=False, layers=1), tmp_path / "llama")
    ckpt = open_checkpoint(folder)
    name = "model.layers.0.mlp.up_proj.weight"
    source = ckpt.reader.handle(ckpt.layout.tensors[name])
    codes, scales = QuantizeJob(source, 4, 16, quantize).handles()
    assert isinstance(codes, LazyQuantized) and codes.shape == (64, 2, 8)
    assert scales.shape == (128,) and codes.ir_dtype.value == "u8"
    streamed = [b"".join(bytes(c) for c in h.iter_chunks(100)) for h in (codes, scales)]
    # both handles from one job, reading the source in slices, never whole
    assert ckpt.reader.stats.quantized == 1 and ckpt.reader.stats.materialized == 0
    want_codes, want_scales = quantize(source.load(), 4, 16)
    assert streamed[0] == want_codes.numpy().tobytes()
    assert streamed[1] == want_scales.numpy().tobytes()
