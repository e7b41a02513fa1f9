"""`dayzero coverage`: op tables per backend, fallbacks by decomposition, exit status."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import backends
from backends import Backend, Capabilities
from compiler.cli import main
from compiler.frontend import export
from compiler.ir import parse_ir, print_ir
from compiler.spec import load_spec
from compiler.tools.coverage import _decomposition_ops, coverage_report, judge, op_uses
from compiler.tools.partial_export import export_partial

ROOT = Path(__file__).resolve().parents[2]
MLP = f"{ROOT}/examples/mlp.py:build"
CUSTOM = f"{ROOT}/tests/tools/custom_op_model.py:build"


def _only(*ops: str) -> type[Backend]:
    """A backend class that claims exactly `ops` (it never lowers anything)."""

    class Only(Backend):
        def capabilities(self) -> Capabilities:
            return Capabilities(ops=frozenset(ops), dtypes=frozenset({"f32"}))

        def lower(self, graph, weights, options):
            raise NotImplementedError

        def load(self, artifact):
            raise NotImplementedError

    return Only


@pytest.fixture
def registered():
    names = []

    def register(name, cls):
        backends.register(name, cls)
        names.append(name)

    yield register
    for name in names:
        backends.unregister(name)


def test_mlp_is_fully_covered_by_the_builtin_backends(capsys):
    assert main(["coverage", MLP, "--backend", "onnxruntime", "--backend", "reference"]) == 0
    out = capsys.readouterr().out.splitlines()
    table = {line.split()[0]: line.split() for line in out[1:] if line and line[0] != " "}
    assert out[0].split()[:5] == ["op", "kind", "count", "onnxruntime", "reference"]
    assert table["linear"][:5] == ["linear", "matmul", "3", "yes", "yes"]
    assert table["gelu"][:5] == ["gelu", "elementwise", "2", "yes", "yes"]
    assert table["layer_norm"][2] == "1"
    assert ".py:" in table["linear"][5]  # nn.Sequential's line: the model has no forward
    assert "coverage onnxruntime: 3/3 ops (100.0%)" in out
    assert "coverage reference: 3/3 ops (100.0%)" in out


def test_custom_op_is_missing_everywhere_and_exits_1(capsys):
    assert main(["coverage", CUSTOM, "--backend", "onnxruntime"]) == 1
    out = capsys.readouterr().out
    assert "coverage onnxruntime: 3/4 ops (75.0%), 1 missing: " \
           "dayzero_demo.clipped_swish.default" in out
    line = next(x for x in out.splitlines() if x.startswith("dayzero_demo.clipped_swish"))
    assert "unconverted" in line and "MISSING" in line
    assert "custom_op_model.py:31 (h = clipped_swish(self.up(x), 4.0))" in line
    assert "no backend runs: dayzero_demo.clipped_swish.default" in out


def test_json_report(capsys):
    assert main(["coverage", CUSTOM, "--backend", "onnxruntime", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    ops = {o["op"]: o for o in report["ops"]}
    assert report["uncovered"] == ["dayzero_demo.clipped_swish.default"]
    assert ops["linear"]["count"] == 2 and ops["linear"]["source"] == "ir"
    assert ops["linear"]["backends"]["onnxruntime"]["status"] == "supported"
    custom = ops["dayzero_demo.clipped_swish.default"]
    assert custom["source"] == "aten" and custom["backends"]["onnxruntime"]["status"] == "missing"
    assert report["summary"]["onnxruntime"]["missing"] == ["dayzero_demo.clipped_swish.default"]


def test_fallback_through_a_decomposition(registered, capsys):
    # gelu (exact) decomposes to elementwise ops with erf: one backend has all of those,
    # the other lacks erf
    module, inputs, dynamic = _mlp_args()
    graph = export(module, inputs, dynamic_shapes=dynamic)
    gelu = next(n for n in graph.nodes if n.op == "gelu")
    parts = _decomposition_ops(gelu)
    registered("decomposing", _only("linear", "layer_norm", *parts))
    registered("no_erf", _only("linear", "layer_norm", *[p for p in parts if p != "erf"]))
    assert "erf" in parts
    assert main(["coverage", MLP, "--backend", "decomposing", "--backend", "no_erf"]) == 0
    out = capsys.readouterr().out
    assert "coverage decomposing: 3/3 ops (100.0%), 1 by fallback: gelu" in out
    assert "coverage no_erf: 2/3 ops (66.7%), 1 missing: gelu" in out
    assert "decomposing: gelu: runs as its decomposition into" in out


def test_fallback_to_another_backend(registered, capsys):
    registered("linear_only", _only("linear"))
    assert main(["coverage", MLP, "--backend", "linear_only", "--fallback", "reference"]) == 0
    out = capsys.readouterr().out
    assert "coverage linear_only: 3/3 ops (100.0%), 2 by fallback: gelu, layer_norm" in out
    assert "linear_only: gelu, layer_norm: runs on reference (compile --fallback reference)" in out


def _mlp_args():
    spec = load_spec(MLP)
    return spec.module, spec.example_inputs, spec.dynamic_shapes


def test_node_level_limits_are_reported_with_counts():
    graph = parse_ir("""graph g {
  input %x: f32[4, 5]
  input %i: i64[2]
  input %m: bool[4]
  %a: f32[2, 5] = index(%x, %i) loc("m.py:3")
  %b: f32[4, 5] = index(%x, %m) loc("m.py:4")
  return %a
}""")
    use = op_uses(graph, [])[0]
    verdict = judge(backends.get("onnxruntime"), use)
    assert verdict.status == "missing"
    assert "bool mask" in verdict.detail and "1 of 2 nodes, first at m.py:4" in verdict.detail
    assert judge(backends.get("reference"), use).status == "supported"


def test_partial_export_matches_export_when_everything_converts():
    module, inputs, dynamic = _mlp_args()
    partial = export_partial(module, inputs, dynamic)
    assert partial.missing == []
    graph = export(module, inputs, dynamic_shapes=dynamic)
    assert [(n.op, n.loc) for n in partial.graph.nodes] == [(n.op, n.loc) for n in graph.nodes]
    assert print_ir(graph) == print_ir(parse_ir(print_ir(graph)))


def test_a_failed_converter_is_a_row_of_the_table(monkeypatch, capsys):
    """A converter bug (here: a type torch disagrees with, as cumsum(dtype=int32) once gave) is
    listed like a missing op instead of crashing coverage, and the nodes it made before it
    failed are not counted as the model's."""
    from compiler.frontend.aten import CONVERTERS

    monkeypatch.setitem(CONVERTERS, "aten.layer_norm.default",
                        lambda em, a: em.op("sum", a["input"], dims=[0]))
    assert main(["coverage", MLP, "--backend", "onnxruntime"]) == 1
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line and line[0] != " "}
    assert "sum" not in rows and rows["linear"].split()[2] == "3"
    row = rows["aten.layer_norm.default"]
    assert "(converter error: IR value %layer_norm has type f32[64] but torch computed " \
           "f32[s0, 64])" in row and "MISSING" in row
    assert "coverage onnxruntime: 2/3 ops" in out


def test_a_line_every_layer_runs_is_one_row_counted_per_occurrence(tmp_path, capsys):
    """Boolean-mask indexing in each of 4 layers: one row, count 4 (not one row per layer's
    data-dependent size, nor the 16 nodes those sizes stopped)."""
    spec = tmp_path / "masked.py"
    spec.write_text(textwrap.dedent("""\
        import torch

        class Layer(torch.nn.Module):
            def forward(self, x):
                return x + x[x > 0].sum()

        def build():
            model = torch.nn.Sequential(*(Layer() for _ in range(4)))
            return model, (torch.randn(3, 4),), None
        """))
    assert main(["coverage", f"{spec}:build", "--backend", "onnxruntime"]) == 1
    out = capsys.readouterr().out
    rows = [line.split("  ") for line in out.splitlines()[1:] if line.startswith("aten.")]
    assert len(rows) == 1 and rows[0][0].startswith("aten.index.Tensor (boolean-mask")
    assert [c.strip() for c in rows[0] if c.strip()][1:3] == ["unconverted", "4"]
    assert "data-dependent size u" not in out


def test_unknown_backend_is_an_error(capsys):
    assert main(["coverage", MLP, "--backend", "nosuch"]) == 1
    assert "unknown backend 'nosuch'" in capsys.readouterr().err


def test_backend_that_cannot_start_is_skipped(registered):
    class Broken(_only("add")):
        def __init__(self):
            raise RuntimeError("no device")

    registered("broken", Broken)
    module, inputs, dynamic = _mlp_args()
    partial = export_partial(module, inputs, dynamic)
    report = coverage_report("MLP", op_uses(partial.graph, partial.missing),
                             ["reference", "broken"])
    assert report.backends == ["reference"]
    assert "no device" in report.skipped["broken"]
    assert report.uncovered() == []
