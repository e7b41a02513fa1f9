"""The weight layout registry (backends.base.WEIGHT_LAYOUTS): each layout's NumPy functions
undo each other, parameters are declared and checked (a manifest's are not trusted), the
writer refuses a plan with the wrong parameters, and the onnxruntime planner stores a weight in
a parameterised layout only when every reader agrees on the parameters."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from backends.base import WEIGHT_LAYOUTS, DerivedWeight, with_sources
from compiler.errors import ArtifactError, DayzeroError
from compiler.ir import DType

SOURCES = {  # layout -> (a source it fits, its parameters)
    "panels32": (np.arange(64 * 5, dtype=np.float32).reshape(64, 5), {}),
    "int4_tiles8": (np.arange(16 * 4 * 16).astype(np.uint8).reshape(16, 4, 16), {}),
    "scale_tiles8": (np.arange(16 * 4).astype(np.float16), {"rows": 16}),
}


@pytest.mark.parametrize("name", sorted(WEIGHT_LAYOUTS))
def test_each_layout_is_undone_exactly(name):
    layout, (source, params) = WEIGHT_LAYOUTS[name], SOURCES[name]
    stored = layout.forward(source, **params)
    assert stored.shape == layout.shape(source.shape, **params)
    assert stored.dtype == source.dtype and stored.flags.c_contiguous
    assert not np.array_equal(stored.reshape(-1), source.reshape(-1))  # really reordered
    np.testing.assert_array_equal(layout.inverse(stored, **params), source)


def test_the_scale_tiles_hold_eight_columns_per_block():
    """scales [N * blocks] (row-major by column) -> [N/8, blocks, 8]: tile t, block j, lane c
    is column 8t + c's scale of block j."""
    rows, blocks = 16, 4
    scales = np.arange(rows * blocks, dtype=np.float16)
    tiles = WEIGHT_LAYOUTS["scale_tiles8"].forward(scales, rows=rows)
    for t, j, c in ((0, 0, 0), (1, 2, 3), (1, 3, 7)):
        assert tiles[t, j, c] == scales[(8 * t + c) * blocks + j]


@pytest.mark.parametrize("params", [{}, {"rows": 16, "extra": 1}, {"rows": "16"},
                                    {"rows": True}, {"rows": 0}, {"rows": -8}, [16], None])
def test_parameters_must_be_exactly_the_declared_positive_ints(params):
    assert WEIGHT_LAYOUTS["scale_tiles8"].arguments(params) is None
    assert WEIGHT_LAYOUTS["scale_tiles8"].arguments({"rows": 16}) == {"rows": 16}
    assert WEIGHT_LAYOUTS["panels32"].arguments({}) == {}


def test_with_sources_skips_bad_entries_and_names_a_bad_tensor():
    source, _ = SOURCES["scale_tiles8"]
    stored = {"s.t": WEIGHT_LAYOUTS["scale_tiles8"].forward(source, rows=16)}
    good = {"s.t": {"source": "s", "layout": "scale_tiles8", "params": {"rows": 16}}}
    np.testing.assert_array_equal(with_sources(stored, good)["s"], source)
    for entry in ({"source": "s", "layout": "scale_tiles8"},  # the parameter is missing
                  {"source": "s", "layout": "scale_tiles8", "params": {"rows": 1.5}},
                  {"source": 3, "layout": "panels32"}, "not a mapping"):
        assert "s" not in with_sources(stored, {"s.t": entry})
    assert with_sources(stored, ["not", "a", "mapping"]) == stored
    with pytest.raises(ArtifactError, match="s.t"):
        with_sources({"s.t": np.zeros(7, np.float16)}, good)  # rank 1: not the tiles


def _graph(shapes: dict[str, tuple[int, ...]], dtype: DType = DType.f16):
    weights = {n: SimpleNamespace(type=SimpleNamespace(shape=s, dtype=dtype))
               for n, s in shapes.items()}
    return SimpleNamespace(weights=weights, weight_data=dict.fromkeys(shapes))


@pytest.mark.parametrize("params, message", [({}, r"takes \['rows'\]"),
                                             ({"rows": 24}, "does not fit")])
def test_the_writer_refuses_a_plan_with_wrong_parameters(params, message):
    from compiler.writer.hashed_files import _derived_spec

    graph = _graph({"s": (64,)})
    assert _derived_spec(graph, "s.t", DerivedWeight("s", "scale_tiles8", params={"rows": 16})) \
        == (DType.f16, (2, 4, 8))
    with pytest.raises(DayzeroError, match=message):
        _derived_spec(graph, "s.t", DerivedWeight("s", "scale_tiles8", params=params))


def test_readers_that_disagree_on_parameters_keep_the_graph_layout():
    """One scales tensor read as 16 columns by one kernel and as 8 by another: no single
    stored layout serves both, so it stays as it is (each kernel folds its own)."""
    from backends.onnxruntime.lower import _storable

    graph = _graph({"s": (64,)})
    assert _storable(graph, "s", "scale_tiles8", [{"rows": 16}, {"rows": 16}])
    assert not _storable(graph, "s", "scale_tiles8", [{"rows": 16}, {"rows": 8}])
    assert not _storable(graph, "s", "scale_tiles8", [None])  # a symbolic size
    assert not _storable(graph, "s", "scale_tiles8", [{"rows": 12}])  # not whole tiles
