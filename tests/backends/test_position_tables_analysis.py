"""Position tables as the named analysis `position_tables`: found once per value, cached on the
graph, printed like every analysis."""

from __future__ import annotations

import numpy as np

from backends.onnxruntime.position_tables import POSITION_TABLES, precomputed_table
from compiler.ir.analysis import describe
from tests.backends.test_onnxruntime_position_tables import _graph


def test_tables_are_found_once_per_value_and_cached_on_the_graph():
    g = _graph()
    tables = g.analysis(POSITION_TABLES)
    first = tables.table(g.outputs[0])
    np.testing.assert_array_equal(first, precomputed_table(g.outputs[0], g.symbols,
                                                           g.weight_data))
    assert tables.table(g.outputs[0]) is first  # not computed again
    assert tables.table(g.outputs[4]) is None  # reads the model input
    assert g.analysis(POSITION_TABLES) is tables
    assert describe(g).splitlines() == ["# analysis position_tables:",
                                        "#   %table: precomputed [1, 1, 40, 8] float32",
                                        "#   %input: computed per call"]
    g.add_input("y", g.inputs[0].type)
    assert g.analysis(POSITION_TABLES) is not tables
