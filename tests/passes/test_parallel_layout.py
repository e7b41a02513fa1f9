"""Layouts, the mesh, layout conversions and how reshapes carry splits."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compiler.errors import DayzeroError
from compiler.ir import symbol
from passes.parallel import REPLICATED, Layout, Mesh
from passes.parallel.layout_conversion import plan_conversion, pre_slice
from passes.parallel.rules_view import reshape_blocks, reshape_mapping

S0 = symbol("s0")


@pytest.mark.parametrize("text", ["R", "tp:S0", "tp:P", "dp:S0,tp:S2", "dp:S1,tp:P", "dp:P,tp:P"])
def test_layout_text_round_trips(text):
    assert str(Layout.parse(text)) == text


def test_layout_text_is_canonical():
    assert str(Layout.parse("tp:S2, dp:S0")) == "dp:S0,tp:S2"
    assert Layout.parse("R") is REPLICATED and REPLICATED.replicated


@given(st.dictionaries(st.sampled_from(["dp", "tp", "ep"]), st.integers(0, 5)),
       st.sets(st.sampled_from(["dp", "tp", "ep"])))
def test_any_layout_round_trips(splits, partial):
    partial -= set(splits)
    if len(set(splits.values())) != len(splits):
        return
    layout = Layout(tuple(splits.items()), tuple(partial))
    assert Layout.parse(str(layout)) == layout


@pytest.mark.parametrize("bad", ["tp", "tp:S", "tp:X0", "TP:S0", "tp:S0,tp:P", "tp:S0,dp:S0"])
def test_bad_layout_text_is_refused(bad):
    with pytest.raises(ValueError):
        Layout.parse(bad)


def test_layout_queries_and_local_shape():
    layout = Layout.parse("dp:S0,tp:S2")
    assert layout.dim_of("tp") == 2 and layout.axis_of(0) == "dp" and layout.dim_of("ep") is None
    assert layout.local_shape((4, S0, 64), {"dp": 2, "tp": 4}) == (2, S0, 16)
    assert str(layout.without("dp").with_partial("dp")) == "dp:P,tp:S2"


def test_mesh_numbers_ranks_with_tensor_parallel_innermost():
    mesh = Mesh(dp=2, pp=2, tp=2)
    assert mesh.world_size == 8
    assert [mesh.coords(r) for r in (0, 1, 2, 5)] == [
        {"dp": 0, "pp": 0, "tp": 0}, {"dp": 0, "pp": 0, "tp": 1}, {"dp": 1, "pp": 0, "tp": 0},
        {"dp": 0, "pp": 1, "tp": 1}]
    assert all(mesh.rank(**mesh.coords(r)) == r for r in range(8))
    assert mesh.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert mesh.group(5, "pp") == [1, 5]


def test_mesh_from_config_checks_sizes():
    assert Mesh.from_config({"tensor_parallel": 2, "pipeline_parallel": 3}) == Mesh(1, 3, 2)
    with pytest.raises(DayzeroError, match="parallel.tensor_parallel"):
        Mesh(tp=0)


@pytest.mark.parametrize("src,dst,ops", [
    ("tp:P", "R", ["all_reduce"]),
    ("tp:P", "tp:S1", ["reduce_scatter"]),
    ("tp:S2", "R", ["all_gather"]),
    ("tp:S2", "tp:S1", ["all_gather", "shard"]),
    ("R", "tp:S0", ["shard"]),
    ("dp:S0,tp:P", "dp:S0", ["all_reduce"]),
    ("dp:S0,tp:P", "R", ["all_gather", "all_reduce"]),
    ("tp:S0", "tp:S0", []),
])
def test_conversion_steps(src, dst, ops):
    steps = plan_conversion(Layout.parse(src), Layout.parse(dst))
    assert [s.op for s in steps] == ops
    if steps:
        assert steps[-1].layout == Layout.parse(dst)


def test_nothing_converts_into_a_partial_sum():
    with pytest.raises(ValueError, match="partial"):
        plan_conversion(REPLICATED, Layout.parse("tp:P"))


def test_pre_slice_is_the_layout_before_local_slicing():
    assert pre_slice(Layout.parse("tp:S2"), Layout.parse("tp:S1")) == REPLICATED
    assert pre_slice(REPLICATED, Layout.parse("tp:S0")) == REPLICATED
    assert pre_slice(Layout.parse("tp:P"), Layout.parse("tp:S0")) == Layout.parse("tp:S0")


def test_reshape_blocks_group_dims_of_equal_size():
    assert reshape_blocks((1, S0, 64), (1, S0, 4, 16)) == [([0], [0]), ([1], [1]), ([2], [2, 3])]
    assert reshape_blocks((1, 2, 2, S0, 16), (1, 4, S0, 16)) == [
        ([0], [0]), ([1, 2], [1]), ([3], [2]), ([4], [3])]
    assert reshape_blocks((2, S0), (S0, 2)) is None


def test_reshape_carries_a_split_of_the_major_dim_only():
    assert reshape_mapping((1, S0, 64), (1, S0, 4, 16)) == {0: None, 1: 1, 2: 2}
    assert reshape_mapping((1, S0, 4, 16), (1, S0, 64)) == {0: None, 1: 1, 2: 2, 3: None}
    assert reshape_mapping((1, 2, S0, 16), (1, 2, 1, S0, 16)) == {0: None, 1: 1, 2: 3, 3: 4}
