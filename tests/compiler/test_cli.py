"""The `dayzero` command line: staged logs, exit codes, and one clear message per bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import runtime
from compiler.cli import main

ROOT = Path(__file__).resolve().parents[2]
MLP = f"{ROOT}/examples/mlp.py:build"


def test_compile_logs_each_stage(tmp_path, capsys):
    out = tmp_path / "m.dz"
    dump = tmp_path / "ir"
    assert main(["compile", MLP, "-o", str(out), "--backend", "reference",
                 "--dump-ir", str(dump)]) == 0
    err = capsys.readouterr().err
    for stage in ("[load]", "[export]", "[passes]", "[lower+write]"):
        assert stage in err
    assert "done in" in err
    dumps = sorted(p.name for p in dump.glob("*.dzir"))
    assert dumps[0].startswith("00-") and len(dumps) >= 2
    assert (out / "manifest.json").is_file()


def test_existing_output_is_refused_unless_forced(mlp_artifact, capsys):
    before = (mlp_artifact / "manifest.json").read_bytes()
    assert main(["compile", MLP, "-o", str(mlp_artifact), "--backend", "reference"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert (mlp_artifact / "manifest.json").read_bytes() == before
    assert main(["compile", MLP, "-o", str(mlp_artifact), "--backend", "reference", "--force"]) == 0


def test_run_with_files_matches_api(mlp_artifact, tmp_path, capsys):
    model = runtime.load(mlp_artifact)
    spec = model.input_specs[0]
    x = np.random.default_rng(0).standard_normal(
        [d if isinstance(d, int) else 3 for d in spec.shape]).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npz"
    assert main(["run", str(mlp_artifact), "--input", f"{spec.name}=" + str(tmp_path / "x.npy"),
                 "--output", str(out)]) == 0
    saved = np.load(out)
    expected = model(x)
    assert [saved[s.name].tolist() for s in model.output_specs] == [e.tolist() for e in expected]
    assert "ran in" in capsys.readouterr().out


def test_run_generates_inputs_within_specs(mlp_artifact, capsys):
    assert main(["run", str(mlp_artifact)]) == 0
    assert "inputs: generated" in capsys.readouterr().out


def test_inspect_artifact_and_dzir(mlp_artifact, tmp_path, capsys):
    assert main(["inspect", str(mlp_artifact)]) == 0
    text = capsys.readouterr().out
    assert "backend reference" in text and "\ngraph " in text
    dzir = tmp_path / "g.dzir"
    dzir.write_text((mlp_artifact / "graph.dzir").read_text())
    assert main(["inspect", str(dzir)]) == 0
    assert capsys.readouterr().out == dzir.read_text()
    assert main(["inspect", str(mlp_artifact), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["manifest"]["backend"] == "reference"


def test_backends_lists_builtin_and_plugin(capsys):
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "reference:" in out


@pytest.mark.parametrize("spec, message", [
    ("nope/missing.py:build", "does not exist"),
    (f"{ROOT}/examples/mlp.py:no_such_function", "has no function 'no_such_function'"),
    (f"{ROOT}/examples/mlp.py", "is not of the form"),
])
def test_bad_specs_are_one_clear_error(spec, message, tmp_path, capsys):
    assert main(["compile", spec, "-o", str(tmp_path / "x.dz"), "--backend", "reference"]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "x.dz").exists()


def test_spec_returning_the_wrong_thing(tmp_path, capsys):
    (tmp_path / "bad.py").write_text("import torch\n"
                                     "def one():\n    return torch.nn.Linear(2, 2)\n"
                                     "def two():\n    return 'model', (torch.ones(2),)\n"
                                     "def three():\n    return torch.nn.Linear(2, 2), [1]\n"
                                     "def boom():\n    raise RuntimeError('kaput')\n")
    for fn, message in [("one", "not a tuple"), ("two", "as the model"),
                        ("three", "as a tuple"), ("boom", "kaput")]:
        assert main(["compile", f"{tmp_path}/bad.py:{fn}", "-o", str(tmp_path / "x.dz"),
                     "--backend", "reference"]) == 1
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    assert f"{tmp_path}/bad.py:9" in err  # the user's line that raised


def test_malformed_dzir_names_line_and_column(tmp_path, capsys):
    bad = tmp_path / "bad.dzir"
    bad.write_text("graph main {\n  input %x: f32[2]\n  %y: f32[2] = relu(%x\n  return %y\n}\n")
    assert main(["inspect", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "line 3" in err and "column" in err and "Traceback" not in err


def test_console_script_usage_error_exits_2():
    result = subprocess.run([sys.executable, "-m", "compiler.cli", "compile"],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "usage" in result.stderr


def test_plugin_backend_from_entry_point_compiles_and_runs(tmp_path, capsys, plugin_site):
    """The example plugin (tests/plugin, as an installed distribution) is found through its
    entry point."""
    (tmp_path / "tiny.py").write_text(
        "import torch\n"
        "class Tiny(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 3)\n"
        "        self.gate = torch.nn.Linear(4, 3)\n"
        "    def forward(self, x):\n"
        "        return torch.tanh(torch.relu(self.fc(x)) - self.gate(x))\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return Tiny(), (torch.randn(2, 4),)\n")
    out = tmp_path / "tiny.dz"
    assert main(["backends"]) == 0
    assert "testplugin:" in capsys.readouterr().out
    assert main(["compile", f"{tmp_path}/tiny.py:build", "-o", str(out),
                 "--backend", "testplugin"]) == 0
    model = runtime.load(out)
    assert model.manifest["backend"] == "testplugin"
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    import torch

    from compiler.spec import load_spec

    module = load_spec(f"{tmp_path}/tiny.py:build").module
    want = module(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(model(x)[0], want, rtol=1e-5, atol=1e-6)


def test_unsupported_backend_op_is_listed(tmp_path, capsys, testplugin):
    out = tmp_path / "mlp.dz"
    assert main(["compile", MLP, "-o", str(out), "--backend", "testplugin"]) == 1
    err = capsys.readouterr().err
    assert "backend 'testplugin' does not support" in err and "Traceback" not in err
    assert not out.exists()


def test_report_shows_fusion_counts_and_patterns(tmp_path, capsys):
    out = tmp_path / "llama.dz"
    assert main(["compile", f"{ROOT}/examples/llama.py:build", "-o", str(out), "--backend",
                 "reference", "--report", "--passes",
                 "remove_noops,fold_constants,eliminate_common_subexpressions,"
                 "eliminate_dead_code,fuse,fuse_groups"]) == 0
    text = capsys.readouterr().out
    assert "fusion: 184 nodes -> 53 nodes" in text
    assert "add_rms_norm" in text and "attention_gqa" in text and "multi_head_attention" in text
    graph = (out / "graph.dzir").read_text()
    assert "gated_mlp(" in graph and "origin=" in graph


def test_inspect_shows_onnx_ops_per_ir_node(tmp_path, capsys):
    out = tmp_path / "mlp_ort.dz"
    assert main(["compile", MLP, "-o", str(out), "--backend", "onnxruntime"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "# lowering by onnxruntime:" in text
    lowering = text.split("# lowering by onnxruntime:")[1]
    assert "linear" in lowering and ("MatMul" in lowering or "Gemm" in lowering)
