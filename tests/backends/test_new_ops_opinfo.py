"""OpInfo conformance of the scatter family, FFT and complex views on every backend.

These ops came in for models the sweep found blocked (MoE routers' scatter, FNet's FFT,
DeepSeek-V2's complex rotary); test_opinfo.py checks them on the reference interpreter with
the rest of op_db, here each OpInfo's float32 samples are also compiled for onnxruntime (the
default pipeline) and triton (its host ops and kernels, under Triton's interpreter) and must match
eager: within 1e-5 for scatter's exact writes, per `TOLERANCE` where a backend computes a
transform another way (FFT as a DFT matmul sums in another order than pocketfft).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (no CUDA here)

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

import backends  # noqa: E402
import compiler  # noqa: E402
import runtime  # noqa: E402
from compiler.config import load_config  # noqa: E402
from compiler.driver import lower_and_write  # noqa: E402
from compiler.errors import DayzeroError  # noqa: E402
from compiler.log import SILENT  # noqa: E402
from tests.compiler.test_opinfo import SamplesModule, eager_outputs, float32_samples  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")]

SCATTER = ["scatter", "scatter_add", "scatter_reduce.sum", "scatter_reduce.prod",
           "scatter_reduce.mean", "scatter_reduce.amax", "scatter_reduce.amin"]
SPECTRAL = ["fft.fft", "fft.fftn", "fft.rfft", "fft.irfftn"]
COMPLEX = ["polar", "view_as_complex", "complex", "real"]
SAMPLES = 4
TOLERANCE = {name: 1e-4 for name in SPECTRAL}  # the DFT's sums run in another order

_BY_ID = {f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name: op
          for op in op_db}


def _compile_and_run(module: SamplesModule, backend: str, tmp_path) -> list:
    graph = compiler.export(module, tuple(module.inputs))
    out = tmp_path / f"{backend}{len(list(tmp_path.iterdir()))}.dz"
    config = load_config(None)
    passes = None if backend == "onnxruntime" else "remove_noops,fold_constants,fuse_groups"
    path = lower_and_write(graph, out, backends.get(backend), config, passes=passes,
                           dump_ir=None, force=False, log=SILENT)
    return [torch.from_numpy(x) for x in runtime.load(path)(*module.inputs)]


def check_on(name: str, backend: str, tmp_path) -> str | None:
    """None when `name`'s samples match eager on `backend`; else the backend's refusal."""
    op = _BY_ID[name]
    samples = float32_samples(op, SAMPLES)
    assert samples, name
    module = SamplesModule(op.op, samples)
    expected = eager_outputs(module)
    assert not isinstance(expected, str), expected
    try:
        got = _compile_and_run(module, backend, tmp_path)
    except DayzeroError as exc:
        if not exc.what.startswith(f"backend '{backend}' does not support"):
            raise
        return exc.what
    tol = TOLERANCE.get(name, 1e-5)
    assert len(got) == len(expected)
    for g, w in zip(got, expected):
        torch.testing.assert_close(g, w, atol=tol, rtol=tol, equal_nan=True)
    return None


@pytest.mark.parametrize("backend", ["onnxruntime", "triton"])
@pytest.mark.parametrize("name", SCATTER)
def test_scatter_family(name, backend, tmp_path):
    if backend == "triton":
        pytest.importorskip("triton")
    assert check_on(name, backend, tmp_path) is None


@pytest.mark.parametrize("backend", ["onnxruntime", "triton"])
@pytest.mark.parametrize("name", SPECTRAL + COMPLEX)
def test_fft_and_complex_views(name, backend, tmp_path):
    if backend == "triton":
        pytest.importorskip("triton")
    refused = check_on(name, backend, tmp_path)
    if refused is not None:
        # a DFT matrix too large to fold at compile time is built per call with `remainder`,
        # which triton has no kernel for: refused by name (`--fallback onnxruntime` runs it)
        assert backend == "triton" and name in SPECTRAL, refused
        assert refused.startswith("backend 'triton' does not support: remainder ("), refused


@pytest.mark.parametrize("backend", ["onnxruntime", "triton"])
def test_unfold(backend, tmp_path):
    """Tensor.unfold (Inkling2's causal convolution windows) as one index_select."""
    if backend == "triton":
        pytest.importorskip("triton")
    assert check_on("unfold", backend, tmp_path) is None
