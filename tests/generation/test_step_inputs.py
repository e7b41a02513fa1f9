"""build_step's index inputs, value by value: the packing every generation step runs on."""

import numpy as np

from runtime.generation.step import StepPart, build_step


def test_three_parts_with_cached_keys_in_scattered_blocks():
    parts = [StepPart(np.array([7, 8]), 5, [3, 9]),        # positions 5, 6 after 5 cached
             StepPart(np.array([4]), 0, [1], logits=False),  # a prompt's first chunk
             StepPart(np.array([5]), 2, [0])]
    step = build_step(parts, block_size=4)
    expected = {
        "input_ids": [[7, 8, 4, 5]],
        "positions": [5, 6, 0, 2],
        "seq_slots": [[12, 13, 14, 15, 36, -2, -3],
                      [-4, -1, -1, -1, -1, -1, -1],
                      [0, 1, -5, -1, -1, -1, -1]],
        "token_seq": [0, 0, 1, 2],
        "token_len": [6, 7, 1, 3],
        "logit_indices": [1, 3],
    }
    assert sorted(step.feeds) == sorted(expected)
    for name, want in expected.items():
        got = step.feeds[name]
        assert got.dtype == np.int64, name
        np.testing.assert_array_equal(got, np.array(want), err_msg=name)
    np.testing.assert_array_equal(step.write_slots, [37, 38, 4, 2])
    assert step.logit_parts == [0, 2]


def test_a_step_that_wants_no_logits_still_returns_the_last_row():
    parts = [StepPart(np.array([1, 2, 3]), 0, [2, 0], logits=False)]
    step = build_step(parts, block_size=2)
    np.testing.assert_array_equal(step.feeds["seq_slots"], [[-2, -3, -4]])
    np.testing.assert_array_equal(step.write_slots, [4, 5, 0])
    np.testing.assert_array_equal(step.feeds["logit_indices"], [2])
    assert step.logit_parts == [0]
