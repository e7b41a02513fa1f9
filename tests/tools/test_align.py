"""`dayzero align` end to end: clean backends pass, a perturbed op is named, fp16 is explained."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

import backends
from compiler.cli import main
from compiler.frontend import export
from compiler.spec import load_spec
from compiler.tools.align_target import run_alignment, target_from_spec
from passes import DEFAULT_PIPELINE
from tests.numerics import fp32_bound
from tests.tools.perturb_backend import perturbing

ROOT = Path(__file__).resolve().parents[2]
TINY = f"{ROOT}/tests/tools/tiny_model.py:build"
LLAMA = f"{ROOT}/examples/llama.py:build"
FP16 = "precision: {weight_dtype: fp16, activation_dtype: fp16}\n"
FUSED = "remove_noops,fold_constants,eliminate_common_subexpressions,eliminate_dead_code,fuse"


@pytest.fixture
def perturb():
    """Register a perturbing backend as "perturb" for one test."""
    def register(op, occurrence=0, relative=1e-2, observe=True):
        cls = perturbing(op, occurrence, relative)
        if not observe:
            cls = type("Blind", (cls,), {"observe": _blind_observe, "load": _blind_load})
        backends.register("perturb", cls)
    yield register
    backends.unregister("perturb")


def _blind_observe(self, artifact, values):
    return None


def _blind_load(self, artifact):
    run = perturbing(*self.target).observe(self, artifact, [])
    return lambda inputs: run(inputs)[0]


def test_clean_backend_passes_with_every_value_compared(capsys):
    assert main(["align", TINY]) == 0
    out = capsys.readouterr().out
    assert "0 above threshold" in out and "OK: every compared value" in out
    assert "reference vs torch eager: outputs max abs err 0.00e+00" in out
    for op in ("linear", "layer_norm", "softmax", "matmul", "add"):
        assert re.search(rf"^%\S+\s+{op}\s", out, re.M), op


def test_perturbed_softmax_is_the_first_divergence(perturb, capsys, tmp_path):
    perturb("softmax")
    html = tmp_path / "report.html"
    assert main(["align", TINY, "--backend", "perturb", "--json", "--html", str(html)]) == 1
    report = json.loads(capsys.readouterr().out)
    first = report["first_failure"]
    assert first["op"] == "softmax" and first["class"] == "strict"
    assert first["loc"].endswith("tiny_model.py:17")  # weights = torch.softmax(...)
    values = report["values"]
    position = next(i for i, v in enumerate(values) if v["value"] == first["value"])
    assert position > 0 and all(v["ok"] for v in values[:position])
    assert values[-1]["ok"] is False  # the error reaches the output
    page = html.read_text()
    svgs = re.findall(r"<svg.*?</svg>", page, re.S)
    assert len(svgs) == 2
    for svg in svgs:
        ET.fromstring(svg)  # well-formed
    assert "FIRST DIVERGENCE at %" + first["value"] in page


def test_text_report_names_the_op_and_source_line(perturb, capsys):
    perturb("layer_norm", relative=1e-3)
    assert main(["align", TINY, "--backend", "perturb"]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("FIRST DIVERGENCE"))
    assert "= layer_norm (f32[2,5,8]" in line and "strict threshold for f32" in line
    assert "tiny_model.py:16" in out  # h = self.norm(self.proj(x))
    assert "fix this one first" in out


def test_a_backend_without_observe_is_compared_on_outputs(perturb, capsys):
    perturb("softmax", observe=False)
    assert main(["align", TINY, "--backend", "perturb"]) == 1
    out = capsys.readouterr().out
    assert "cannot expose intermediate values" in out
    assert "FIRST DIVERGENCE at %out = add" in out


def test_tolerances_from_the_command_line(perturb, capsys):
    perturb("softmax", relative=1e-3)
    assert main(["align", TINY, "--backend", "perturb", "--atol", "1", "--rtol", "1"]) == 0
    assert "0 above threshold" in capsys.readouterr().out


def test_artifact_alignment_and_given_inputs(tmp_path, capsys):
    out = tmp_path / "tiny.dz"
    assert main(["compile", TINY, "-o", str(out), "--passes", DEFAULT_PIPELINE]) == 0
    x = np.random.default_rng(3).standard_normal((2, 7, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    capsys.readouterr()
    assert main(["align", str(out), "--input", f"x={tmp_path / 'x.npy'}", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["inputs"] == [{"name": "x", "dtype": "float32",
                                                  "shape": [2, 7, 8]}]
    assert report["compared"] >= 6 and report["unmatched"] == []
    assert main(["align", str(out), "--passes", "fuse"]) == 1
    assert "--passes applies to a SPEC" in capsys.readouterr().err
    assert main(["align", TINY, "--artifact", str(out), "--backend", "reference"]) == 1
    assert "--backend with --artifact" in capsys.readouterr().err
    assert main(["align", TINY, "--artifact", str(out)]) == 0


def test_backend_options_shape_the_compile_and_session_settings_the_run(capsys):
    from backends.onnxruntime import read_record
    from backends.onnxruntime.fused import ContribFallbackWarning

    spec = load_spec(TINY)
    excluded = {"onnxruntime": {"exclude_kernels": ["com.microsoft.FusedMatMul"]}}
    with pytest.warns(ContribFallbackWarning, match="FusedMatMul"), \
            target_from_spec(spec, backend_options=excluded) as target:
        kernels = {op for entry in read_record(target.artifact)["nodes"] for op in entry["onnx"]}
        report = run_alignment(target, target.example_inputs,
                               session={"intra_op_threads": 1, "allow_spinning": False})
    assert "com.microsoft.FusedMatMul" not in kernels and "Gemm" in kernels
    assert report.ok and len(report.checks) >= 6
    with pytest.warns(ContribFallbackWarning):
        assert main(["align", TINY, "--session", "intra_op_threads=1", "--backend-option",
                     "exclude_kernels=[com.microsoft.FusedMatMul]"]) == 0


def test_session_and_backend_option_errors_name_the_setting(tmp_path, capsys):
    assert main(["align", TINY, "--session", "intra_op_treads=1"]) != 0
    assert "session.intra_op_treads" in capsys.readouterr().err
    assert main(["align", TINY, "--backend", "reference", "--session", "intra_op_threads=1"]) != 0
    assert "backend 'reference' has no session settings" in capsys.readouterr().err
    out = tmp_path / "tiny.dz"
    assert main(["compile", TINY, "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["align", str(out), "--backend-option", "session.intra_op_threads=1"]) != 0
    assert "--backend-option applies to a SPEC" in capsys.readouterr().err
    assert main(["align", str(out), "--session", "intra_op_threads=1"]) == 0


def test_session_settings_reach_a_backend_that_only_loads_with_them(capsys):
    # triton takes session settings in `load` (for its onnxruntime segments) and has no
    # `observe`: the alignment compares outputs only, with the settings applied
    assert main(["align", TINY, "--backend", "triton", "--session", "intra_op_threads=1",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["outputs_only"]


# -- the Llama example on onnxruntime: fp32, fp16 with fusion, a perturbed attention -------------
@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    spec = load_spec(LLAMA)
    reference = export(spec.module, spec.example_inputs, dynamic_shapes=spec.dynamic_shapes)
    config = tmp_path_factory.mktemp("align") / "fp16.yaml"
    config.write_text(FP16)
    return spec, reference, config


def _align(llama, **kwargs):
    spec, reference, _ = llama
    atol, rtol = kwargs.pop("atol", None), kwargs.pop("rtol", None)
    with target_from_spec(spec, reference=reference, **kwargs) as target:
        return run_alignment(target, target.example_inputs, atol=atol, rtol=rtol)


def test_llama_fp32_on_onnxruntime_matches_everywhere(llama):
    report = _align(llama)
    assert report.ok and not report.outputs_only
    # the reference interpreter runs the exported (decomposed) ops, not the module's own code
    assert report.eager_max_abs <= fp32_bound(*report.reference_outputs)
    assert len(report.checks) > 100 and not report.unmatched
    assert max(c.errors.max_abs for c in report.checks if c.dtype == "f32") < 1e-4
    assert {c.layer for c in report.checks} == {"input", "layers.0", "layers.1"}


def test_llama_fp16_errors_grow_but_stay_within_thresholds(llama):
    report = _align(llama, config=llama[2], passes=FUSED)
    assert report.ok, report.first_failure
    rules = {c.rule for c in report.checks}
    assert {"name", "origin", "reader", "output"} <= rules  # fused and merged values compared
    norms = [c for c in report.checks if c.op == "rms_norm"]
    assert len(norms) == 5 and all(c.precision == "f16" and c.dtype == "f32" for c in norms)
    # the error of the normalized residual stream grows layer by layer
    assert norms[0].errors.max_abs < norms[-1].errors.max_abs
    assert all(c.errors.max_abs > 1e-5 for c in norms)  # f16 rounding, not f32's


def test_llama_fp16_against_fp32_tolerances_fails_at_the_first_norm(llama):
    # the f16 embedding rows are small (init std 0.02), so their rounding stays under atol;
    # the first rms_norm scales them to unit size, and there the f16 rounding shows
    report = _align(llama, config=llama[2], passes=FUSED, atol=1e-4, rtol=1e-4)
    first = report.first_failure
    assert first is not None and first.op == "rms_norm" and first.precision == "f16"
    assert report.checks[0].op == "embedding" and report.checks[0].ok
    assert first.loc.endswith("modeling_llama.py:67")


def test_llama_perturbed_second_attention_is_found(llama, perturb):
    perturb("scaled_dot_product_attention", occurrence=1, relative=1e-3)
    report = _align(llama, backend="perturb")
    first = report.first_failure
    attention = [c for c in report.checks if c.op == "scaled_dot_product_attention"]
    assert attention[0].ok and first is attention[1]
    assert first.layer == "layers.1" and first.loc.endswith("modeling_llama.py:258")
