"""onnxruntime backend options set by the user: the config's `backend_options:`,
`compiler.compile(backend_options=...)`, `dayzero compile --backend-option`, load-time session
overrides (`runtime.load(session=...)`, `dayzero run --session`) and `auto` spinning."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import compiler
import runtime
from backends.onnxruntime import OnnxRuntimeBackend
from backends.onnxruntime.fused import ContribFallbackWarning
from backends.onnxruntime.session import SPINNING_KEY, SessionConfig, affinity_cpus, session_options
from compiler.cli import main
from compiler.config import load_config
from compiler.driver import _lower_options
from compiler.errors import DayzeroError
from compiler.ir import DType, Graph, TensorType
from compiler.writer import write_artifact
from examples.mlp import build
from runtime.artifact import Artifact
from tests.backends.onnxruntime_util import compile_graph

ROOT = Path(__file__).resolve().parents[2]
MLP = f"{ROOT}/examples/mlp.py:build"
CONFIG = ("backend_options:\n"
          "  onnxruntime: {session: {allow_spinning: true, intra_op_threads: 2},\n"
          "                exclude_kernels: [com.microsoft.Gelu]}\n")
GELU = "com.microsoft.Gelu"


@pytest.fixture(scope="module")
def mlp():
    return build()


@pytest.fixture(scope="module")
def default_artifact(mlp, tmp_path_factory):
    model, inputs, dynamic = mlp
    return compiler.compile(model, inputs, out=tmp_path_factory.mktemp("ort") / "default.dz",
                            dynamic_shapes=dynamic)


@pytest.fixture(scope="module")
def options_artifact(mlp, tmp_path_factory):
    """Config file options, with the API's intra_op_threads winning over the file's."""
    model, inputs, dynamic = mlp
    folder = tmp_path_factory.mktemp("ort")
    (folder / "c.yaml").write_text(CONFIG)
    with pytest.warns(ContribFallbackWarning, match=GELU):
        return compiler.compile(model, inputs, out=folder / "options.dz", dynamic_shapes=dynamic,
                                config=folder / "c.yaml",
                                backend_options={"onnxruntime": {"session": {
                                    "intra_op_threads": 1}}})


def record(path: Path) -> dict:
    return json.loads((path / "backend" / "lowering.json").read_text())


def onnx_ops(path: Path) -> set[str]:
    return {op for entry in record(path)["nodes"] for op in entry["onnx"]}


def spinning(model) -> str:
    return model._executable.session.get_session_options().get_session_config_entry(SPINNING_KEY)


def assert_matches_eager(mlp, model) -> None:
    module = mlp[0]
    for batch in (3, 7):
        x = torch.randn(batch, 32, generator=torch.Generator().manual_seed(batch))
        with torch.no_grad():
            want = module(x).numpy()
        np.testing.assert_allclose(model(x)[0], want, rtol=1e-5, atol=1e-5)


def test_defaults_record_auto_spinning_and_use_the_fused_gelu(default_artifact):
    assert record(default_artifact)["session"]["allow_spinning"] == "auto"
    assert record(default_artifact)["session"]["intra_op_threads"] == 0
    assert json.loads((default_artifact / "manifest.json").read_text())["backend_options"] == {}
    assert GELU in onnx_ops(default_artifact)


def test_config_and_api_options_are_recorded_and_applied(options_artifact, mlp):
    session = record(options_artifact)["session"]
    assert session["intra_op_threads"] == 1  # the API's value over the file's 2
    assert session["allow_spinning"] is True
    manifest = json.loads((options_artifact / "manifest.json").read_text())
    assert manifest["backend_options"] == {
        "session": {"allow_spinning": True, "intra_op_threads": 1}, "exclude_kernels": [GELU]}
    ops = onnx_ops(options_artifact)
    assert GELU not in ops and "Erf" in ops  # gelu lowered with standard ops
    model = runtime.load(options_artifact)
    assert model._executable.session.get_session_options().intra_op_num_threads == 1
    assert spinning(model) == "1"
    assert "intra_op_threads=1" in model.describe()
    assert "allow_spinning=true" in model.describe()
    assert_matches_eager(mlp, model)


def test_cli_backend_options_merge_over_the_config_file(tmp_path, mlp, capsys):
    (tmp_path / "c.yaml").write_text(CONFIG)
    out = tmp_path / "cli.dz"
    with pytest.warns(ContribFallbackWarning, match=GELU):
        assert main(["compile", MLP, "-o", str(out), "--config", str(tmp_path / "c.yaml"),
                     "--backend-option", "session.intra_op_threads=1",
                     "--backend-option", "onnxruntime:session.allow_spinning=auto",
                     "--backend-option", "session.graph_optimization_level=extended"]) == 0
    session = record(out)["session"]
    assert (session["intra_op_threads"], session["allow_spinning"],
            session["graph_optimization_level"]) == (1, "auto", "extended")
    assert GELU not in onnx_ops(out)  # exclude_kernels from the file still applies
    model = runtime.load(out)
    assert model._executable.session.get_session_options().intra_op_num_threads == 1
    assert_matches_eager(mlp, model)


@pytest.mark.parametrize("option, message", [
    ("session.intra_op_threads", "no '='"),
    ("session..intra_op_threads=1", "not a key"),
    (":session.intra_op_threads=1", "not a backend name"),
    ("exclude_kernels=[com.microsoft.Gelu", "not valid YAML"),
    ("session.intra_op_threads=", "no value"),
])
def test_cli_bad_backend_option_syntax_is_a_usage_error(tmp_path, capsys, option, message):
    with pytest.raises(SystemExit) as info:
        main(["compile", MLP, "-o", str(tmp_path / "m.dz"), "--backend-option", option])
    assert info.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "--backend-option" in errors[0] and message in errors[0]


def test_cli_unknown_backend_option_names_the_key(tmp_path, capsys):
    out = tmp_path / "m.dz"
    assert main(["compile", MLP, "-o", str(out), "--backend-option", "session.threads=1"]) == 1
    err = capsys.readouterr().err
    assert "error: unknown onnxruntime session option " \
           "'backend_options.onnxruntime.session.threads'" in err
    assert "intra_op_threads" in err and "Traceback" not in err  # lists the known ones
    assert not out.exists()


def test_cli_unknown_backend_prefix_is_refused_before_export(tmp_path, capsys):
    assert main(["compile", MLP, "-o", str(tmp_path / "m.dz"),
                 "--backend-option", "onnxrt:session.intra_op_threads=1"]) == 1
    err = capsys.readouterr().err
    assert "'backend_options.onnxrt'" in err and "--backend-option" in err
    assert "onnxruntime" in err and "[export]" not in err


def tiny_graph() -> Graph:
    g = Graph()
    x = g.add_input("x", TensorType(DType.f32, (2, 4)))
    g.outputs = [g.add_node("gelu", [x], {}).output]
    return g


@pytest.mark.parametrize("options, key", [
    ({"bogus": 1}, "'backend_options.onnxruntime.bogus'"),
    ({"session": {"threads": 2}}, "'backend_options.onnxruntime.session.threads'"),
    ({"session": {"allow_spinning": "sometimes"}},
     "'backend_options.onnxruntime.session.allow_spinning'"),
    ({"session": {"allow_spinning": 1}}, "'backend_options.onnxruntime.session.allow_spinning'"),
    ({"session": {"intra_op_threads": -1}},
     "'backend_options.onnxruntime.session.intra_op_threads'"),
    ({"session": 4}, "'backend_options.onnxruntime.session'"),
    ({"exclude_kernels": "com.microsoft.Gelu"}, "'backend_options.onnxruntime.exclude_kernels'"),
    ({"exclude_kernels": ["com.microsoft.Gelux"]}, "'backend_options.onnxruntime.exclude_kernels'"),
])
def test_bad_options_name_the_config_key_path(tmp_path, options, key):
    with pytest.raises(DayzeroError) as info:
        compile_graph(tiny_graph(), tmp_path / "m.dz", options)
    assert key in info.value.what
    assert not (tmp_path / "m.dz").exists()


def test_unknown_option_error_lists_the_known_ones(tmp_path):
    with pytest.raises(DayzeroError) as info:
        compile_graph(tiny_graph(), tmp_path / "m.dz", {"sesion": {}})
    assert "session" in info.value.fix and "exclude_kernels" in info.value.fix


def test_load_time_session_override(default_artifact, mlp):
    model = runtime.load(default_artifact, session={"allow_spinning": False,
                                                    "intra_op_threads": 1})
    options = model._executable.session.get_session_options()
    assert options.intra_op_num_threads == 1 and spinning(model) == "0"
    assert "intra_op_threads=1" in model.describe()
    assert "allow_spinning=false" in model.describe()
    assert record(default_artifact)["session"]["allow_spinning"] == "auto"  # artifact unchanged
    forced_on = runtime.load(default_artifact, session={"allow_spinning": True})
    assert spinning(forced_on) == "1"
    assert forced_on._executable.session.get_session_options().intra_op_num_threads == \
        affinity_cpus()
    assert_matches_eager(mlp, model)


def test_bad_load_time_override_names_the_key(default_artifact):
    with pytest.raises(DayzeroError, match="'session.threads'") as info:
        runtime.load(default_artifact, session={"threads": 1})
    assert "intra_op_threads" in info.value.fix
    with pytest.raises(DayzeroError, match="'session.allow_spinning'"):
        runtime.load(default_artifact, session={"allow_spinning": "maybe"})


def test_backend_without_session_settings_refuses_an_override(tmp_path):
    path = write_artifact(tmp_path / "ref.dz", tiny_graph(), "reference")
    with pytest.raises(DayzeroError, match="backend 'reference' has no session settings"):
        runtime.load(path, session={"allow_spinning": False})
    assert runtime.load(path).describe() is None  # and loads unchanged without one


def test_run_session_override(default_artifact, capsys):
    assert main(["run", str(default_artifact), "--session", "allow_spinning=false",
                 "--session", "intra_op_threads=1"]) == 0
    out = capsys.readouterr().out
    assert "onnxruntime session:" in out
    assert "intra_op_threads=1" in out and "allow_spinning=false" in out
    with pytest.raises(SystemExit) as info:
        main(["run", str(default_artifact), "--session", "allow_spinning"])
    assert info.value.code == 2
    assert "argument --session: 'allow_spinning' is not KEY=VALUE" in capsys.readouterr().err
    assert main(["run", str(default_artifact), "--session", "spin=true"]) == 1
    assert "'session.spin'" in capsys.readouterr().err


def test_auto_spinning_follows_the_load_average():
    cpus = affinity_cpus()
    auto = SessionConfig()
    assert auto.allow_spinning == "auto"
    idle = auto.resolve(load_average=lambda: cpus - 0.5)
    busy = auto.resolve(load_average=lambda: float(cpus))
    assert (idle.allow_spinning, busy.allow_spinning) == (True, False)
    assert "auto: load average" in idle.describe() and f"< {cpus} CPUs" in idle.describe()
    assert f">= {cpus} CPUs" in busy.describe()
    assert session_options(idle).get_session_config_entry(SPINNING_KEY) == "1"
    assert session_options(busy).get_session_config_entry(SPINNING_KEY) == "0"
    assert auto.resolve(load_average=lambda: math.inf).allow_spinning is False
    never = lambda: pytest.fail("the load average is read only for auto")  # noqa: E731
    assert SessionConfig(allow_spinning=True).resolve(never).allow_spinning is True
    assert SessionConfig(allow_spinning=False).resolve(never).allow_spinning is False


def test_backend_load_decides_auto_with_the_injected_probe(default_artifact):
    backend, artifact = OnnxRuntimeBackend(), Artifact(default_artifact)
    options = lambda ex: ex.session.get_session_options()  # noqa: E731
    idle = backend.load(artifact, load_average=lambda: 0.0)
    busy = backend.load(artifact, load_average=lambda: 1000.0)
    assert options(idle).get_session_config_entry(SPINNING_KEY) == "1"
    assert options(busy).get_session_config_entry(SPINNING_KEY) == "0"
    assert idle.settings.allow_spinning is True and busy.settings.allow_spinning is False
    assert "allow_spinning=false (auto: load average 1000.00" in busy.describe()
    forced = backend.load(artifact, session={"allow_spinning": True},
                          load_average=lambda: 1000.0)
    assert options(forced).get_session_config_entry(SPINNING_KEY) == "1"


def test_fallback_backend_gets_its_own_options():
    cfg = load_config({"backend_options": {
        "onnxruntime": {"session": {"intra_op_threads": 1}},
        "triton": {}}})
    assert _lower_options(cfg, "triton", "onnxruntime") == {
        "fallback": "onnxruntime",
        "fallback_options": {"session": {"intra_op_threads": 1}}}
    assert _lower_options(cfg, "onnxruntime", None) == {"session": {"intra_op_threads": 1}}
    assert _lower_options(load_config(None), "triton", "onnxruntime") == {
        "fallback": "onnxruntime"}
