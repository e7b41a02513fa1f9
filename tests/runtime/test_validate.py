"""Input validation: every way an input can miss its spec gives an InputError that says how."""

from __future__ import annotations

import numpy as np
import pytest

from compiler.errors import InputError
from runtime.index_inputs import IndexRange
from runtime.specs import TensorSpec
from runtime.validate import prepare_inputs, validate_inputs

IDS = TensorSpec("input_ids", "i64", (1, "s0"), {"s0": (2, 512)})
MASK = TensorSpec("mask", "bool", (1, "s0"), {"s0": (2, 512)})
PAIR = TensorSpec("pair", "f32", ("2*s0", "s1"), {"s0": (2, 512), "s1": (1, None)})


def ids(n: int) -> np.ndarray:
    return np.zeros((1, n), np.int64)


def mask(n: int) -> np.ndarray:
    return np.ones((1, n), bool)


def test_valid_inputs_bind_symbols():
    assert validate_inputs([IDS, MASK], [ids(7), mask(7)]) == {"s0": 7}
    pair = np.zeros((14, 1000), np.float32)
    assert validate_inputs([IDS, PAIR], [ids(7), pair]) == {"s0": 7, "s1": 1000}


@pytest.mark.parametrize("arrays, message", [
    ([ids(4)], r"the model takes 2 input\(s\) \(input_ids, mask\), got 1"),
    ([ids(4), mask(4), mask(4)], r"the model takes 2 input\(s\) \(input_ids, mask\), got 3"),
    ([ids(4).astype(np.int32), mask(4)], "input 'input_ids' has dtype i32 but the model expects "
                                         "i64"),
    ([ids(4), mask(4).astype(np.float16)], "input 'mask' has dtype f16 but the model expects bool"),
    ([np.zeros(4, np.int64), mask(4)], r"input 'input_ids' has rank 1 \(shape \[4\]\) but the "
                                       r"model expects rank 2: i64\[1, s0\]"),
    ([np.zeros((2, 4), np.int64), mask(4)], "input 'input_ids' dim 0 is 2 but must be 1"),
    ([ids(600), mask(600)], r"input 'input_ids' dim 1 is 600 but s0 must be in \[2, 512\]"),
    ([ids(1), mask(1)], r"input 'input_ids' dim 1 is 1 but s0 must be in \[2, 512\]"),
    ([ids(5), mask(6)], r"input 'mask' dim 1 is 6 but s0 is 5 \(from input 'input_ids' dim 1\)"),
])
def test_invalid_inputs(arrays, message):
    with pytest.raises(InputError, match=message):
        validate_inputs([IDS, MASK], arrays)


def test_error_says_what_to_do():
    with pytest.raises(InputError) as info:
        validate_inputs([IDS, MASK], [ids(4).astype(np.int32), mask(4)])
    assert info.value.fix == "convert it, e.g. x.astype(np.int64)"
    assert info.value.where == "input 'input_ids'"


def test_expression_dims_are_checked_once_symbols_are_bound():
    with pytest.raises(InputError, match=r"input 'pair' dim 0 is 15 but 2\*s0 = 14 \(s0 = 7\)"):
        validate_inputs([IDS, PAIR], [ids(7), np.zeros((15, 3), np.float32)])


def test_unbounded_range_message():
    spec = TensorSpec("x", "f32", ("s1",), {"s1": (3, None)})
    with pytest.raises(InputError, match="input 'x' dim 0 is 2 but s1 must be >= 3"):
        validate_inputs([spec], [np.zeros(2, np.float32)])
    assert validate_inputs([spec], [np.zeros(10**6, np.float32)]) == {"s1": 10**6}


def test_unsupported_numpy_dtype_is_named():
    spec = TensorSpec("x", "f32", (2,), {})
    with pytest.raises(InputError, match="input 'x' has dtype complex64 but the model expects f32"):
        validate_inputs([spec], [np.zeros(2, np.complex64)])


def test_big_endian_inputs_are_converted_to_native_byte_order():
    spec = TensorSpec("x", "f32", (3,), {})
    x = np.array([1.5, -2.0, 3.25], np.float32)
    arrays, _ = prepare_inputs([spec], [x.astype(">f4")])
    assert arrays[0].dtype.isnative and arrays[0].dtype == np.float32
    np.testing.assert_array_equal(arrays[0], x)
    assert prepare_inputs([spec], [x])[0][0] is x  # native input: no copy


TABLE = {"input_ids": IndexRange("input_ids", 0, 256, "embed.weight", "embedding")}


@pytest.mark.parametrize("value, position", [(256, 3), (-1, 0), (10**9, 5)])
def test_index_outside_its_table_is_named(value, position):
    x = ids(7)
    x[0, position] = value
    with pytest.raises(InputError) as info:
        validate_inputs([IDS, MASK], [x, mask(7)], TABLE)
    assert info.value.what == (f"input 'input_ids' holds {value} at position [0, {position}], "
                               "outside the valid range [0, 255] of the weight table "
                               "'embed.weight' it indexes (embedding)")
    assert "[0, 255]" in info.value.fix


def test_indices_inside_their_table_pass():
    x = np.arange(7, dtype=np.int64)[None] * 42
    assert validate_inputs([IDS, MASK], [x, mask(7)], TABLE) == {"s0": 7}
