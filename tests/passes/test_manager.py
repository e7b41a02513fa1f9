from __future__ import annotations

from dataclasses import dataclass
from textwrap import dedent
from typing import ClassVar

import pytest
import torch

from backends.reference.interpreter import run_graph
from compiler.errors import DayzeroError, VerificationError
from compiler.ir import parse_ir, print_ir
from passes import (
    Pass,
    PassCrashError,
    PassManager,
    PassResult,
    register_pass,
    unregister_pass,
)

TEXT = dedent("""\
    graph main {
      input %x: f32[2, 4]
      weight @w: f32[3, 4]
      weight @unused: f32[4]
      %r: f32[2, 4] = reshape(%x) {shape=[2, 4]}
      %wt: f32[4, 3] = permute(@w) {dims=[1, 0]}
      %y1: f32[2, 3] = matmul(%r, %wt)
      %y2: f32[2, 3] = matmul(%x, %wt)
      %s: f32[2, 3] = add(%y1, %y2)
      %dead: f32[2, 3] = exp(%s)
      return %s
    }
    """)

EXPECTED = dedent("""\
    graph main {
      input %x: f32[2, 4]
      weight @folded.wt: f32[4, 3]
      %y1: f32[2, 3] = matmul(%x, @folded.wt)
      %s: f32[2, 3] = add(%y1, %y1)
      return %s
    }
    """)

# the default pipeline without plan_memory, which leaves the graph as it is
CLEANUP = "remove_noops,fold_constants,eliminate_common_subexpressions,eliminate_dead_code"


def graph_with_data():
    graph = parse_ir(TEXT)
    graph.weight_data.update(w=torch.randn(3, 4), unused=torch.randn(4))
    return graph


def body(path) -> str:
    """A dump file without its header comment lines."""
    return "".join(line for line in path.read_text().splitlines(keepends=True)
                   if not line.startswith("#"))


def test_default_pipeline_result_and_numerics():
    graph = graph_with_data()
    x = torch.randn(2, 4)
    (expected,) = run_graph(graph, graph.weight_data, [x])
    out = PassManager(CLEANUP).run(graph)
    assert print_ir(out) == EXPECTED
    (got,) = run_graph(out, out.weight_data, [x])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert set(out.weight_data) == {"folded.wt"}


def test_records_time_change_and_node_counts():
    lines = []
    manager = PassManager(CLEANUP + ",eliminate_dead_code", log=lines.append)
    manager.run(graph_with_data())
    assert [(r.name, r.changed, r.nodes_before, r.nodes_after) for r in manager.records] == [
        ("remove_noops", True, 6, 5),
        ("fold_constants", True, 5, 4),
        ("eliminate_common_subexpressions", True, 4, 3),
        ("eliminate_dead_code", True, 3, 2),
        ("eliminate_dead_code", False, 2, 2),
    ]
    assert all(r.seconds >= 0 for r in manager.records)
    assert len(lines) == 5 and "fold_constants" in lines[1] and " ms" in lines[1]
    assert "unchanged" in lines[4]
    report = manager.timing_report()
    assert all(r.name in report for r in manager.records)
    manager.run(graph_with_data())
    assert len(manager.records) == 5


def test_dumps_after_every_pass_parse_back(tmp_path):
    manager = PassManager(CLEANUP, dump_dir=tmp_path / "ir")
    out = manager.run(graph_with_data())
    names = sorted(p.name for p in (tmp_path / "ir").iterdir())
    assert names == ["00-input.dzir", "01-remove_noops.dzir", "02-fold_constants.dzir",
                     "03-eliminate_common_subexpressions.dzir", "04-eliminate_dead_code.dzir"]
    for path in (tmp_path / "ir").iterdir():
        assert print_ir(parse_ir(path.read_text(), str(path))) == body(path)
    first = (tmp_path / "ir" / "02-fold_constants.dzir").read_text().splitlines()[0]
    assert first == "# *** IR after fold_constants ***"
    assert f"# pipeline: {CLEANUP}" in (tmp_path / "ir" / "00-input.dzir").read_text()
    assert body(tmp_path / "ir" / "00-input.dzir") == TEXT
    assert body(tmp_path / "ir" / "04-eliminate_dead_code.dzir") == print_ir(out)


def test_dump_only_changed_or_named_passes(tmp_path):
    PassManager("eliminate_dead_code,remove_noops,eliminate_dead_code", dump_dir=tmp_path / "a",
                dump="changed").run(graph_with_data())
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "00-input.dzir", "01-eliminate_dead_code.dzir", "02-remove_noops.dzir"]
    PassManager(CLEANUP, dump_dir=tmp_path / "b",
                dump={"fold_constants"}).run(graph_with_data())
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [
        "00-input.dzir", "02-fold_constants.dzir"]
    with pytest.raises(DayzeroError, match="unknown pass.*fold_constant\\b"):
        PassManager(CLEANUP, dump={"fold_constant"})


def test_pipeline_of_pass_instances_and_no_dump_dir_writes_nothing(tmp_path, monkeypatch):
    from passes.eliminate_dead_code import EliminateDeadCode

    monkeypatch.chdir(tmp_path)
    manager = PassManager([EliminateDeadCode()])
    assert manager.pipeline == "eliminate_dead_code"
    manager.run(graph_with_data())
    assert list(tmp_path.iterdir()) == []


@dataclass(frozen=True)
class _Crash(Pass):
    """Test pass that always raises."""

    name: ClassVar[str] = "test_crash"
    summary: ClassVar[str] = "raise ZeroDivisionError"

    def run(self, graph):
        return 1 // 0


@dataclass(frozen=True)
class _BreakGraph(Pass):
    """Test pass that drops the first node but not its uses."""

    name: ClassVar[str] = "test_break_graph"
    summary: ClassVar[str] = "leave a dangling use"

    def run(self, graph):
        graph.nodes = graph.nodes[1:]
        return PassResult(graph, True)


@dataclass(frozen=True)
class _Liar(Pass):
    """Test pass that changes the graph and says it did not."""

    name: ClassVar[str] = "test_liar"
    summary: ClassVar[str] = "claim changed=False after a change"

    def run(self, graph):
        graph.nodes[-1].outputs[0].name = "renamed"
        return PassResult(graph, False)


@dataclass(frozen=True)
class _WrongReturn(Pass):
    """Test pass returning a bare graph instead of a PassResult."""

    name: ClassVar[str] = "test_wrong_return"
    summary: ClassVar[str] = "return the graph alone"

    def run(self, graph):
        return graph


@dataclass(frozen=True)
class _UserError(Pass):
    """Test pass raising a user-facing error."""

    name: ClassVar[str] = "test_user_error"
    summary: ClassVar[str] = "raise DayzeroError"

    def run(self, graph):
        raise DayzeroError("model has no lm_head", "node %s", "pass --no-head")


@pytest.fixture
def test_passes():
    classes = [_Crash, _BreakGraph, _Liar, _WrongReturn, _UserError]
    for cls in classes:
        register_pass(cls)
    yield
    for cls in classes:
        unregister_pass(cls.name)


def test_crash_writes_a_reproducer_and_names_the_pass(tmp_path, test_passes):
    manager = PassManager("remove_noops,test_crash,eliminate_dead_code", dump_dir=tmp_path)
    with pytest.raises(PassCrashError) as info:
        manager.run(graph_with_data())
    error = info.value
    assert isinstance(error, DayzeroError)
    assert error.pass_name == "test_crash"
    assert error.reproducer == tmp_path / "crash-test_crash.dzir"
    assert "pass 'test_crash' crashed: ZeroDivisionError" in str(error)
    assert str(error.reproducer) in str(error)
    assert isinstance(error.__cause__, ZeroDivisionError)
    text = error.reproducer.read_text()
    assert "# pipeline: test_crash\n" in text
    assert "# full pipeline: remove_noops,test_crash,eliminate_dead_code\n" in text
    # the reproducer is the crashing pass's input: the graph after remove_noops
    assert body(error.reproducer) == body(tmp_path / "01-remove_noops.dzir")
    assert print_ir(parse_ir(text)) == body(error.reproducer)
    assert not (tmp_path / "02-test_crash.dzir").exists()


def test_crash_without_dump_dir_uses_a_temp_dir(test_passes):
    with pytest.raises(PassCrashError) as info:
        PassManager("test_crash").run(graph_with_data())
    path = info.value.reproducer
    assert path.exists() and path.name == "crash-test_crash.dzir"
    assert body(path) == TEXT
    path.unlink()
    path.parent.rmdir()


def test_verifier_failure_names_the_pass(tmp_path, test_passes):
    with pytest.raises(VerificationError) as info:
        PassManager("eliminate_dead_code,test_break_graph", dump_dir=tmp_path).run(
            graph_with_data())
    message = str(info.value)
    assert "pass 'test_break_graph' produced an invalid graph" in message
    assert "crash-test_break_graph.dzir" in message
    assert (tmp_path / "crash-test_break_graph.dzir").exists()


def test_changed_flag_is_cross_checked(tmp_path, test_passes):
    with pytest.raises(VerificationError, match="'test_liar' reported changed=False"):
        PassManager("test_liar", dump_dir=tmp_path).run(graph_with_data())


def test_wrong_return_type_is_a_crash(test_passes, tmp_path):
    with pytest.raises(PassCrashError, match="expected PassResult"):
        PassManager("test_wrong_return", dump_dir=tmp_path).run(graph_with_data())


def test_user_errors_from_passes_pass_through_unchanged(test_passes, tmp_path):
    with pytest.raises(DayzeroError, match="model has no lm_head") as info:
        PassManager("test_user_error", dump_dir=tmp_path).run(graph_with_data())
    assert not isinstance(info.value, PassCrashError)


def test_verify_off_skips_checks(test_passes):
    graph = PassManager("test_break_graph", verify=False).run(graph_with_data())
    assert len(graph.nodes) == 5


def test_invalid_input_is_reported_before_any_pass():
    graph = graph_with_data()
    graph.nodes = graph.nodes[1:]
    with pytest.raises(VerificationError, match="invalid before any pass"):
        PassManager(CLEANUP).run(graph)


@dataclass(frozen=True)
class _BehindTheBack(Pass):
    """Test pass that rewires an operand without the graph's methods (a stale use-list)."""

    name: ClassVar[str] = "test_behind_the_back"
    summary: ClassVar[str] = "assign node.inputs directly"

    def run(self, graph):
        add = next(n for n in graph.nodes if n.op == "add")
        add.inputs[1] = add.inputs[0]
        return PassResult(graph, True)


def test_a_pass_that_bypasses_the_graph_methods_is_caught(tmp_path):
    register_pass(_BehindTheBack)
    try:
        with pytest.raises(VerificationError) as info:
            PassManager("test_behind_the_back", dump_dir=tmp_path).run(graph_with_data())
    finally:
        unregister_pass(_BehindTheBack.name)
    message = str(info.value)
    assert "pass 'test_behind_the_back' produced an invalid graph" in message
    assert "the use-list of %y1 misses operand 1" in message
