"""Data-dependent runtime checks are dropped; data-dependent computation is still refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import compiler
from backends.reference.interpreter import run_graph
from compiler.frontend import UnsupportedOpsError
from compiler.frontend.runtime_checks import drop_data_checks


class CheckedMerge(nn.Module):
    """LLaVA's pattern: check the placeholder count against the features, then merge them."""

    def forward(self, ids: torch.Tensor, embeds: torch.Tensor, features: torch.Tensor):
        mask = (ids == 7).unsqueeze(-1)
        torch._check_tensor_all(mask.sum() * embeds.shape[-1] == features.numel())
        return embeds.masked_scatter(mask, features)


class DataDependentSize(nn.Module):
    def forward(self, x: torch.Tensor):
        n = (x > 0).sum().item()
        return torch.ones(4) * n


def _inputs():
    ids = torch.tensor([[1, 7, 7, 3, 7]])
    return ids, torch.randn(1, 5, 4), torch.randn(3, 4)


def test_checked_merge_exports_without_its_check_and_matches_eager():
    module, inputs = CheckedMerge(), _inputs()
    graph = compiler.export(module, inputs)
    assert [n.op for n in graph.nodes].count("masked_scatter") == 1
    assert not any(n.op in ("all", "sum") for n in graph.nodes)  # the check's condition: gone
    got = run_graph(graph, graph.weight_data, inputs)[0]
    torch.testing.assert_close(got, module(*inputs), rtol=0, atol=0)


def test_drop_reports_the_removed_assertions():
    program = torch.export.export(CheckedMerge(), _inputs(), strict=False)
    removed = drop_data_checks(program)
    assert removed and all("assert" in name for name in removed)
    targets = {str(n.target) for n in program.graph.nodes}
    assert not any("_local_scalar_dense" in t or "_assert_scalar" in t for t in targets)
    assert drop_data_checks(program) == []  # nothing left to drop


def test_data_dependent_values_that_feed_computation_are_still_reported():
    with pytest.raises(UnsupportedOpsError) as info:
        compiler.export(DataDependentSize(), (torch.randn(6),))
    assert any("_local_scalar_dense" in op for op in info.value.ops)
