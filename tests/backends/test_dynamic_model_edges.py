"""Models compiled end to end on the onnxruntime and reference backends and compared with torch
eager, for the lowerings that once went wrong silently or did not compile: a slice counted from
the end of a dynamic dim (XLM and FlauBERT's `mask[:, -slen:]` came back empty, typed
[1, s0, 4]), an assignment to one (`buf[:, -slen:] = x`, the same start in slice_scatter), a
stepped assignment (interleaved M-RoPE's `freqs[..., 1:10:3] = ...`) and a
cumsum with an explicit int32 dtype (as MoE routers count tokens per expert)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.export import Dim

import compiler
import runtime

BACKENDS = ["onnxruntime", "reference"]


class LastPositions(torch.nn.Module):
    """XLM's attention mask: built for the longest length, then cut to the last `slen` columns
    with a start counted from the end (`mask[:, -slen:]`)."""

    def __init__(self, max_len: int = 32):
        super().__init__()
        self.register_buffer("positions", torch.arange(max_len, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        slen = x.shape[1]
        mask = (self.positions[None, :] < slen).to(x.dtype)[:, :, None]  # [1, 32, 1]
        mask = mask.expand(1, -1, x.shape[2])
        whole = torch.cat([mask, x], dim=1)  # [1, 32 + slen, 4]: cut its last slen rows
        return whole[:, -x.shape[1]:] * 2 + x


class InterleavedSections(torch.nn.Module):
    """Interleaved M-RoPE (Qwen3.5): every third frequency of a dynamic-length table replaced
    by another section's, `freqs[..., offset:length:3] = other[..., offset:length:3]`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        freqs, other = x.sin(), x.cos()
        freqs[..., 1:10:3] = other[..., 1:10:3]
        freqs[..., 2:12:3] = other[..., 2:12:3] * 2
        return freqs


class AssignLast(torch.nn.Module):
    """Slice assignments whose start counts from the end of a dynamic dim."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        buf = torch.cat([x * 0, x * 0 + 1], dim=1)
        buf[:, -x.shape[1]:] = x
        out = buf * 2
        out[:, -x.shape[1]:-1] = 5.0
        return out


class CountPerColumn(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cumsum(x, dim=0, dtype=torch.int32), torch.cumsum(x > 2, dim=1)


def _compile(model, example, out, backend, dynamic_shapes=None):
    path = compiler.compile(model, example, out=out, backend=backend,
                            dynamic_shapes=dynamic_shapes)
    return runtime.load(path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_slice_from_the_end_of_a_dynamic_dim_matches_eager(tmp_path, backend):
    model = LastPositions().eval()
    seq = Dim("seq", min=2, max=16)
    m = _compile(model, (torch.randn(1, 5, 4),), tmp_path / "m.dz", backend,
                 dynamic_shapes=({1: seq},))
    assert str(m.output_specs[0]).endswith("f32[1, s0, 4]")
    for n in (2, 7, 16):
        x = torch.randn(1, n, 4, generator=torch.Generator().manual_seed(n))
        (got,) = m(x)
        with torch.no_grad():
            want = model(x).numpy()
        assert got.shape == (1, n, 4)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _matches_eager_along_dim_1(model, shape, sizes, tmp_path, backend) -> None:
    """Compiled with dim 1 dynamic (from the smallest size to 16), equal to eager at each size."""
    seq = Dim("seq", min=min(sizes), max=16)
    m = _compile(model, (torch.randn(*shape),), tmp_path / "m.dz", backend,
                 dynamic_shapes=({1: seq},))
    for n in sizes:
        x = torch.randn(shape[0], n, *shape[2:], generator=torch.Generator().manual_seed(n))
        np.testing.assert_allclose(m(x)[0], model(x).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_slice_assignment_from_the_end_of_a_dynamic_dim_matches_eager(tmp_path, backend):
    _matches_eager_along_dim_1(AssignLast(), (1, 5, 4), (3, 8), tmp_path, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_slice_assignment_with_a_step_matches_eager(tmp_path, backend):
    _matches_eager_along_dim_1(InterleavedSections(), (3, 5, 12), (2, 9), tmp_path, backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cumsum_with_an_int32_dtype_matches_eager(tmp_path, backend):
    model = CountPerColumn()
    x = torch.randint(0, 5, (6, 3), generator=torch.Generator().manual_seed(0))
    m = _compile(model, (x,), tmp_path / "m.dz", backend)
    got = m(x)
    want = model(x)
    for g, w in zip(got, want):
        assert g.dtype == w.numpy().dtype
        np.testing.assert_array_equal(g, w.numpy())
