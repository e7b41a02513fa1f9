"""grouped_matmul on the triton backend: its grouped-GEMM kernel (under Triton's interpreter here)
against a float64 loop over the groups, with empty groups, rows past the last offset, offsets
that go backwards, a NaN and an Inf row; and a compiled MoE block that runs it."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (no CUDA here)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from backends.triton import device  # noqa: E402
from tests.numerics import assert_fp32_close  # noqa: E402

CASES = {  # rows, k, n, offsets
    "balanced": (24, 40, 36, [6, 12, 18, 24]),
    "empty-groups-and-tail": (21, 32, 20, [0, 9, 9, 17]),  # rows 17..20 past the last offset
    "backwards-and-past-the-end": (10, 16, 48, [7, 3, 30]),
    "one-row": (1, 64, 16, [0, 1]),
}


def loop(x: torch.Tensor, w: torch.Tensor, offsets: list[int]) -> torch.Tensor:
    """Each group's rows times its matrix, in float64."""
    out = torch.zeros(x.shape[0], w.shape[2], dtype=torch.float64)
    start = 0
    for g, end in enumerate(offsets):
        end = min(max(end, start), x.shape[0])
        out[start:end] = x[start:end].double() @ w[g].double()
        start = end
    return out


@pytest.mark.parametrize("case", CASES)
def test_the_kernel_multiplies_each_group_by_its_matrix(case):
    from backends.triton.grouped import grouped_matmul, supported

    rows, k, n, offsets = CASES[case]
    gen = torch.Generator().manual_seed(len(case))
    x = torch.randn(rows, k, generator=gen)
    w = torch.randn(len(offsets), k, n, generator=gen)
    if rows > 4:
        x[2, 5], x[3, 0] = float("nan"), float("inf")
    where = device()
    args = (x.to(where), w.to(where), torch.tensor(offsets, dtype=torch.int32).to(where))
    assert supported(*args)
    got = grouped_matmul(*args).cpu()
    want = loop(x, w, offsets)
    assert_fp32_close(got.numpy(), want.numpy())


def test_the_tile_schedule_covers_each_group_once():
    from backends.triton.grouped import tile_schedule

    assert tile_schedule([0, 9, 9, 40], 35, 16) == [(1, 0, 9), (3, 9, 25), (3, 25, 35)]


def test_a_moe_layer_on_triton_runs_the_kernel_and_matches_eager(tmp_path, monkeypatch):
    from backends.triton import grouped
    from tests.backends.test_moe_models import compile_tiny

    calls = []
    kernel = grouped.grouped_matmul
    monkeypatch.setattr(grouped, "grouped_matmul", lambda *a: calls.append(1) or kernel(*a))
    hf, model = compile_tiny("qwen3_moe", "triton", tmp_path / "m.dz")
    ids = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(0))
    got = model(ids.numpy())[0]
    with torch.no_grad():
        want = hf(ids).logits.numpy()
    assert len(calls) == 4  # two grouped_matmuls in each of the two MoE layers
    assert_fp32_close(np.asarray(got), want)
