"""Lazy tensor handles and dtype conversion: exact bytes, bounded chunks, overflow by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from compiler.checkpoint import LazyConcat, ShardReader, concat_rows, read_layout
from compiler.checkpoint.layout import CheckpointError
from compiler.checkpoint.precision import convert, convert_weight
from compiler.ir import DType
from compiler.ir.weights import WeightOverflowError
from runtime.safetensors_io import TensorEntry, tensor_chunks

from .checkpoint_util import write_raw


@pytest.fixture
def folder(tmp_path):
    torch.manual_seed(0)
    tensors = {"w": torch.randn(300, 7), "h": torch.randn(64).to(torch.bfloat16),
               "big": torch.tensor([1.0, -7e4, 7e4, 3.0]), "ids": torch.arange(10)}
    (tmp_path / "config.json").write_text("{}")
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    return tmp_path, tensors


def _handle(folder, name, dtype=None):
    layout = read_layout(folder)
    reader = ShardReader(layout)
    return reader, reader.handle(layout.tensors[name], dtype)


def test_chunks_reassemble_the_exact_bytes(folder):
    root, tensors = folder
    reader, handle = _handle(root, "w")
    chunks = list(handle.iter_chunks(chunk_bytes=1000))
    assert len(chunks) == -(-300 * 7 * 4 // 1000) and max(c.nbytes for c in chunks) <= 1000
    assert b"".join(bytes(c) for c in chunks) == tensors["w"].numpy().tobytes()
    assert reader.stats.tensors == 1 and reader.stats.bytes_read == 300 * 7 * 4
    assert reader.stats.conversions == {}
    reader.close()


def test_conversion_matches_torch_and_is_counted(folder):
    root, tensors = folder
    reader, handle = _handle(root, "h", DType.f32)
    data = b"".join(bytes(c) for c in handle.iter_chunks(chunk_bytes=64))
    assert data == tensors["h"].float().numpy().tobytes()
    assert reader.stats.conversions == {("bf16", "f32"): 1}
    assert reader.stats.bytes_read == 128 and reader.stats.bytes_written == 256


def test_handles_become_tensors_and_arrays_on_demand(folder):
    root, tensors = folder
    reader, handle = _handle(root, "h")
    assert handle.shape == (64,) and handle.dtype == torch.bfloat16 and handle.nbytes == 128
    t = torch.as_tensor(handle)
    assert t.dtype == torch.bfloat16 and torch.equal(t, tensors["h"])
    a = np.asarray(handle)
    assert a.dtype == DType.bf16.to_numpy() and np.array_equal(a.astype(np.float32),
                                                               tensors["h"].float().numpy())
    assert reader.stats.materialized == 2 and reader.stats.tensors == 0


def test_narrowing_to_fp16_reports_overflow_by_name(folder):
    root, _ = folder
    _, handle = _handle(root, "big", DType.f16)
    with pytest.raises(WeightOverflowError, match=r"weight 'big' does not fit f16: 2 finite "
                                                  r"value\(s\) overflow to inf "
                                                  r"\(largest magnitude 70000"):
        list(handle.iter_chunks())


def test_writer_streams_handles_in_chunks_and_checks_their_type(folder):
    root, tensors = folder
    _, handle = _handle(root, "w")
    entry = TensorEntry("w", DType.f32, (300, 7), 0, 8400)
    assert b"".join(bytes(c) for c in tensor_chunks(handle, entry)) == \
        tensors["w"].numpy().tobytes()
    wrong = TensorEntry("w", DType.bf16, (300, 7), 0, 4200)
    with pytest.raises(Exception, match="streams f32\\[300, 7\\] data but the graph declares bf16"):
        list(tensor_chunks(handle, wrong))


def test_a_tensor_with_a_zero_stride_size_one_dim_is_written_exactly():
    """torch calls [1]- and [1, n]-shaped tensors of stride 0 on the size-1 dim contiguous (a
    folded expand, BART's position ids); their bytes are the values, not a view error."""
    one = torch.tensor([5], dtype=torch.int64).as_strided((1,), (0,))
    row = torch.arange(3.0).as_strided((1, 3), (0, 1))
    for tensor, dtype in ((one, DType.i64), (row, DType.f32)):
        size = tensor.numel() * tensor.element_size()
        entry = TensorEntry("t", dtype, tuple(tensor.shape), 0, size)
        assert b"".join(bytes(c) for c in tensor_chunks(tensor, entry)) == \
            tensor.clone(memory_format=torch.contiguous_format).numpy().tobytes()


def test_unaligned_tensor_is_read_correctly(tmp_path):
    """A hand-written shard may put an f32 tensor at an odd offset."""
    values = np.arange(5, dtype=np.float32)
    header = {"flag": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
              "x": {"dtype": "F32", "shape": [5], "data_offsets": [1, 21]}}
    (tmp_path / "config.json").write_text("{}")
    write_raw(tmp_path / "model.safetensors", header, b"\x07" + values.tobytes())
    _, handle = _handle(tmp_path, "x", DType.bf16)
    assert torch.equal(torch.as_tensor(handle).float(), torch.from_numpy(values))


def test_integer_tensors_are_never_converted(folder):
    root, _ = folder
    layout = read_layout(root)
    with pytest.raises(ValueError, match="cannot map i64"):
        ShardReader(layout).handle(layout.tensors["ids"], DType.f32)


def test_pages_are_released_after_streaming(tmp_path):
    """Streaming a 64 MiB tensor leaves its pages out of this process's resident set."""
    psutil = pytest.importorskip("psutil")
    (tmp_path / "config.json").write_text("{}")
    save_file({"x": torch.ones(16 * 2**20)}, tmp_path / "model.safetensors")
    reader, handle = _handle(tmp_path, "x")
    proc = psutil.Process()
    before = proc.memory_info().rss
    peak = before
    for chunk in handle.iter_chunks(chunk_bytes=4 * 2**20):
        assert np.frombuffer(chunk, np.float32).sum() == chunk.nbytes // 4  # touch every page
        peak = max(peak, proc.memory_info().rss)
    assert peak - before < 32 * 2**20  # a few chunks at most, never the 64 MiB tensor
    reader.close()


def test_convert_weight_on_plain_tensors():
    t = torch.tensor([1.5, -2.25])
    assert convert_weight(t, DType.f32, "t") is t  # nothing to convert
    assert convert_weight(t, DType.bf16, "t").dtype == torch.bfloat16
    assert convert(t, DType.f32, "t") is not t  # always a new tensor
    with pytest.raises(WeightOverflowError, match="weight 'huge' does not fit bf16"):
        convert(torch.tensor([3.4e38]), DType.bf16, "huge")


def test_concatenated_handles_stream_part_by_part(tmp_path):
    """A merged QKV weight of lazy parts is their bytes in order, converted, never assembled."""
    parts = {"q": torch.randn(4, 3), "k": torch.randn(2, 3), "v": torch.randn(2, 3)}
    (tmp_path / "config.json").write_text("{}")
    save_file(parts, tmp_path / "model.safetensors")
    layout = read_layout(tmp_path)
    reader = ShardReader(layout)
    handles = [reader.handle(layout.tensors[n]) for n in parts]
    merged = concat_rows(handles)
    assert isinstance(merged, LazyConcat) and merged.shape == (8, 3)
    expected = torch.cat(list(parts.values()))
    assert b"".join(bytes(c) for c in merged.iter_chunks(chunk_bytes=8)) == \
        expected.numpy().tobytes()
    assert reader.stats.tensors == 3 and reader.stats.materialized == 0
    low = merged.astype_lazy(DType.bf16)
    assert torch.equal(torch.as_tensor(low), expected.to(torch.bfloat16))
    mixed = concat_rows([handles[0], torch.ones(1, 3)])  # not all lazy: an ordinary tensor
    assert torch.equal(mixed, torch.cat([parts["q"], torch.ones(1, 3)]))


def test_materialized_tensors_are_read_by_safe_open_and_never_shared(folder, monkeypatch):
    import safetensors

    opened = []
    real = safetensors.safe_open
    monkeypatch.setattr(safetensors, "safe_open", lambda path, **kw: opened.append(path) or
                        real(path, **kw))
    root, tensors = folder
    reader, handle = _handle(root, "w")
    first, second = torch.as_tensor(handle), torch.as_tensor(handle)
    first.zero_()  # a pass computing in place on its copy
    assert torch.equal(second, tensors["w"]) and opened == [root / "model.safetensors"]
    assert torch.equal(torch.as_tensor(reader.handle(handle.record, DType.bf16)),
                       tensors["w"].to(torch.bfloat16))
    assert reader.stats.materialized == 3 and len(opened) == 1


def test_shard_corrupted_after_opening_is_named_with_its_tensor(folder):
    """The header was checked when the checkpoint was opened; a shard rewritten or cut short
    before a pass reads a tensor is still one clear error, not a library traceback."""
    root, tensors = folder
    shard = root / "model.safetensors"
    _, handle = _handle(root, "w")
    save_file({**tensors, "w": tensors["w"].half()}, shard)
    with pytest.raises(CheckpointError, match=r"shard model.safetensors now holds "
                                              r"torch.float16\[300, 7\], not the f32\[300, 7\]"):
        torch.as_tensor(handle)
    _, handle = _handle(root, "w")
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="shard model.safetensors cannot be read") as info:
        torch.as_tensor(handle)
    assert info.value.where == f"{shard}, tensor 'w'" and "download it again" in info.value.fix
