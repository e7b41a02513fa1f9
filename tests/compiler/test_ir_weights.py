"""compiler.ir.weights: what passes may do with weight data, checked on the checkpoint's lazy
handles (which implement the protocol) and on tensors in memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from compiler.checkpoint import ShardReader, read_layout
from compiler.ir import DType
from compiler.ir.weights import (
    ConvertibleLazily,
    WeightOverflowError,
    concat_rows,
    convert_weight,
    is_lazy,
)
from passes.quantize_weights import quantize


@pytest.fixture
def handles(tmp_path):
    torch.manual_seed(0)
    tensors = {"a": torch.randn(4, 32), "b": torch.randn(2, 32), "c": torch.randn(2, 16)}
    (tmp_path / "config.json").write_text("{}")
    save_file(tensors, tmp_path / "model.safetensors")
    layout = read_layout(tmp_path)
    reader = ShardReader(layout)
    yield reader, {n: reader.handle(layout.tensors[n]) for n in tensors}, tensors
    reader.close()


def test_lazy_handles_are_told_from_data_in_memory(handles):
    _, lazy, tensors = handles
    codes, scales = lazy["a"].quantize_lazily(4, 16, quantize)
    assert all(is_lazy(h) for h in (lazy["a"], codes, scales))
    assert not is_lazy(tensors["a"]) and not is_lazy(tensors["a"].numpy())
    assert isinstance(lazy["a"], ConvertibleLazily) and not isinstance(codes, ConvertibleLazily)


def test_quantize_lazily_reads_nothing_until_streamed(handles):
    reader, lazy, tensors = handles
    codes, scales = lazy["a"].quantize_lazily(4, 16, quantize)
    assert reader.stats.materialized == 0 and codes.shape == (4, 2, 8) and scales.shape == (8,)
    want_codes, want_scales = quantize(tensors["a"], 4, 16)
    assert b"".join(bytes(c) for c in codes.iter_chunks(7)) == want_codes.numpy().tobytes()
    assert b"".join(bytes(c) for c in scales.iter_chunks(7)) == want_scales.numpy().tobytes()


def test_concat_rows_stays_lazy_only_when_it_can(handles):
    reader, lazy, tensors = handles
    merged = concat_rows([lazy["a"], lazy["b"]])
    assert is_lazy(merged) and merged.shape == (6, 32) and reader.stats.materialized == 0
    np.testing.assert_array_equal(np.asarray(merged), torch.cat([tensors["a"], tensors["b"]]))
    with pytest.raises(RuntimeError):  # other trailing dims: torch.cat's own error, not lazy
        concat_rows([lazy["a"], lazy["c"]])
    mixed = concat_rows([lazy["b"], tensors["b"]])
    assert torch.equal(mixed, torch.cat([tensors["b"], tensors["b"]]))


def test_convert_weight_defers_for_lazy_handles_and_checks_tensors(handles):
    reader, lazy, tensors = handles
    low = convert_weight(lazy["a"], DType.bf16, "a")
    assert low.ir_dtype == DType.bf16 and reader.stats.materialized == 0
    assert torch.equal(torch.as_tensor(low), tensors["a"].to(torch.bfloat16))
    with pytest.raises(WeightOverflowError, match=r"weight 'w' does not fit f16: 1 finite"):
        convert_weight(torch.tensor([1.0, 1e5]), DType.f16, "w")
