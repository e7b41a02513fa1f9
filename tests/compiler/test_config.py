"""The config schema: defaults, YAML files, and errors that name the offending key."""

import pytest

from compiler.config import load_config, options_from_assignments, parse_assignment
from compiler.errors import DayzeroError


def test_defaults_fill_every_section():
    cfg = load_config(None)
    assert cfg.parallel == {"tensor_parallel": 1, "pipeline_parallel": 1, "data_parallel": 1,
                            "expert_parallel": 1}
    assert cfg.precision["weight_dtype"] == "fp32"
    assert cfg.quantize == {"weights": None, "group_size": 128, "activations": "float"}
    assert cfg.generation == {"kv_cache_memory": "2GiB", "block_size": 16, "prefill_chunk": 512,
                              "max_batch_tokens": 2048}
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


def test_backend_options_are_kept_per_backend(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("backend_options:\n"
                    "  onnxruntime: {session: {allow_spinning: true, intra_op_threads: 2},\n"
                    "                exclude_kernels: [com.microsoft.Gelu]}\n"
                    "  triton: {fallback: onnxruntime}\n")
    cfg = load_config(path)
    assert cfg.backend_options == {
        "onnxruntime": {"session": {"allow_spinning": True, "intra_op_threads": 2},
                        "exclude_kernels": ["com.microsoft.Gelu"]},
        "triton": {"fallback": "onnxruntime"}}
    assert cfg.options_for("reference") == {}
    options = cfg.options_for("onnxruntime")
    options["session"]["intra_op_threads"] = 8  # a copy: the config is not changed
    assert cfg.backend_options["onnxruntime"]["session"]["intra_op_threads"] == 2
    assert load_config(None).backend_options == {}


@pytest.mark.parametrize("config, key", [
    ({"backend_options": {"onnxrt": {}}}, "'backend_options.onnxrt'"),
    ({"backend_options": {"onnxruntime": [1]}}, "'backend_options.onnxruntime'"),
    ({"backend_options": ["onnxruntime"]}, "'backend_options'"),
])
def test_bad_backend_options_name_the_key(config, key):
    with pytest.raises(DayzeroError) as info:
        load_config(config)
    assert key in info.value.what


def test_unknown_backend_name_lists_the_backends():
    with pytest.raises(DayzeroError) as info:
        load_config({"backend_options": {"onnxrt": {"session": {}}}})
    for name in ("onnxruntime", "reference", "triton"):
        assert name in info.value.fix


def test_api_backend_options_merge_over_the_file_key_by_key():
    cfg = load_config({"backend_options": {"onnxruntime": {
        "session": {"allow_spinning": True, "intra_op_threads": 2},
        "exclude_kernels": ["com.microsoft.Gelu"]}}})
    merged = cfg.with_backend_options({"onnxruntime": {"session": {"intra_op_threads": 1},
                                                       "exclude_kernels": []},
                                       "reference": None})
    assert merged.backend_options == {
        "onnxruntime": {"session": {"allow_spinning": True, "intra_op_threads": 1},
                        "exclude_kernels": []},
        "reference": {}}
    assert cfg.backend_options["onnxruntime"]["session"]["intra_op_threads"] == 2
    assert cfg.with_backend_options(None) is cfg
    with pytest.raises(DayzeroError, match="'backend_options.nope'") as info:
        cfg.with_backend_options({"nope": {}}, source="--backend-option")
    assert info.value.where == "--backend-option"


@pytest.mark.parametrize("text, backend, path, value", [
    ("session.allow_spinning=true", None, ("session", "allow_spinning"), True),
    ("session.allow_spinning=auto", None, ("session", "allow_spinning"), "auto"),
    ("session.intra_op_threads=2", None, ("session", "intra_op_threads"), 2),
    ("exclude_kernels=[com.microsoft.Gelu, com.microsoft.FusedMatMul]", None,
     ("exclude_kernels",), ["com.microsoft.Gelu", "com.microsoft.FusedMatMul"]),
    ("onnxruntime:session.intra_op_threads=1", "onnxruntime", ("session", "intra_op_threads"),
     1),
    ("fallback=a=b", None, ("fallback",), "a=b"),
])
def test_option_assignments_parse_yaml_values(text, backend, path, value):
    item = parse_assignment(text)
    assert (item.backend, item.path, item.value) == (backend, path, value)


@pytest.mark.parametrize("text, message", [
    ("session.allow_spinning", "no '='"),
    ("=1", "not a key"),
    ("session..x=1", "not a key"),
    ("session.x-y=1", "not a key"),
    (":x=1", "not a backend name"),
    ("session.x=", "no value"),
    ("session.x=[1", "not valid YAML"),
])
def test_bad_option_assignments_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        parse_assignment(text)


def test_assignments_build_the_section_later_ones_winning():
    items = [parse_assignment(t) for t in (
        "session.intra_op_threads=2", "exclude_kernels=[com.microsoft.Gelu]",
        "onnxruntime:session.allow_spinning=false", "session.intra_op_threads=1")]
    assert options_from_assignments(items, "triton") == {
        "triton": {"session": {"intra_op_threads": 1},
                   "exclude_kernels": ["com.microsoft.Gelu"]},
        "onnxruntime": {"session": {"allow_spinning": False}}}
    with pytest.raises(ValueError, match="not a key"):
        parse_assignment("onnxruntime:session.x=1", prefixed=False)
