"""FNet (transformers' FNetModel, tiny random config) on onnxruntime: its token mixing,
`torch.fft.fftn(x, dim=(1, 2)).real`, exports as a complex cast, `_fft_c2c` and `view_as_real`;
the frontend builds it as DFT matmuls on (real, imaginary) pairs, with the sequence's DFT
matrix computed per call for a dynamic sequence length. One artifact must match eager at several
lengths within 1e-5 of the output's magnitude."""

from __future__ import annotations

import pytest
import torch

import compiler
import runtime

transformers = pytest.importorskip("transformers")


class _Hidden(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).last_hidden_state


def test_fnet_compiles_and_matches_eager(tmp_path):
    torch.manual_seed(0)
    config = transformers.FNetConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                     intermediate_size=64, max_position_embeddings=64)
    assert not config.use_tpu_fourier_optimizations  # the torch.fft.fftn path
    model = _Hidden(transformers.FNetModel(config).eval())
    ids = torch.randint(0, 99, (1, 12))
    seq = torch.export.Dim("seq", min=2, max=64)
    path = compiler.compile(model, (ids,), tmp_path / "fnet.dz", dynamic_shapes=({1: seq},))
    loaded = runtime.load(path)
    for length in (12, 7, 33):
        x = torch.randint(0, 99, (1, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            want = model(x).numpy()
        got = loaded(x.numpy())[0]
        assert got.shape == want.shape
        assert abs(got - want).max() <= 1e-5 * max(1.0, abs(want).max())
