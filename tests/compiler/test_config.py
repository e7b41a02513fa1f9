"""The config schema: defaults, YAML files, and errors that name the offending key."""

import pytest

from compiler.config import load_config
from compiler.errors import DayzeroError


def test_defaults_fill_every_section():
    cfg = load_config(None)
    assert cfg.parallel == {"tensor_parallel": 1, "pipeline_parallel": 1, "data_parallel": 1}
    assert cfg.precision["weight_dtype"] == "fp32"
    assert cfg.quantize == {"weights": None, "group_size": 128}
    assert cfg.passes is None


def test_yaml_file_round_trips_values(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("parallel: {tensor_parallel: 2}\nprecision: {weight_dtype: bf16}\n"
                    "passes: [fold_constants, eliminate_dead_code]\n")
    cfg = load_config(path)
    assert cfg.parallel["tensor_parallel"] == 2
    assert cfg.parallel["pipeline_parallel"] == 1
    assert cfg.precision["weight_dtype"] == "bf16"
    assert cfg.passes == ["fold_constants", "eliminate_dead_code"]


@pytest.mark.parametrize("config, key", [
    ({"paralel": {}}, "'paralel'"),
    ({"parallel": {"tensor_paralel": 2}}, "'parallel.tensor_paralel'"),
    ({"parallel": {"tensor_parallel": 0}}, "'parallel.tensor_parallel'"),
    ({"parallel": {"tensor_parallel": True}}, "'parallel.tensor_parallel'"),
    ({"precision": {"weight_dtype": "fp12"}}, "'precision.weight_dtype'"),
    ({"quantize": {"weights": "int3"}}, "'quantize.weights'"),
    ({"passes": "fold_constants"}, "'passes'"),
])
def test_bad_keys_and_values_name_the_key(config, key):
    with pytest.raises(DayzeroError) as info:
        load_config(config)
    assert key in info.value.what


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(DayzeroError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("parallel: {tensor_parallel: 2\n")
    with pytest.raises(DayzeroError) as info:
        load_config(bad)
    assert "line" in info.value.where and "bad.yaml" in info.value.where
