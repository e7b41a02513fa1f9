"""The pass manager: runs a pipeline with verification, timing, IR dumps and crash reproducers.

Debugging is built in rather than bolted on (MLIR's `-mlir-print-ir-after-all`, `-mlir-timing`
and crash reproducers): after every pass the graph is verified and the error names the pass that
broke it; every pass is timed into `records`; with a dump directory the IR after each pass is
written as `NN-<pass>.dzir` with a `*** IR after <pass> ***` header comment and, after the graph,
the named analyses still valid for it (`# analysis memory_plan{...}:` comment lines, see
compiler/ir/analysis.py); after a pass that changed the graph, cached analyses are dropped unless
the pass `preserves` them; and when a pass crashes, its input IR and pipeline are written as a
reproducer that parses back with `parse_ir`.
Everything the manager does is driven by its constructor arguments, never by globals.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from compiler.errors import DayzeroError, VerificationError
from compiler.ir import Graph, print_ir, verify
from compiler.ir.analysis import describe, mark_changed
from compiler.ir.collector import collection_paused

from .base import Pass, PassResult
from .pipeline import format_pipeline, parse_pipeline
from .registry import available_passes


class PassRecord(NamedTuple):
    """Timing and effect of one pass run."""

    name: str
    seconds: float
    changed: bool
    nodes_before: int
    nodes_after: int


class PassCrashError(DayzeroError):
    """A pass raised; `reproducer` is the .dzir file holding its input IR and the pipeline."""

    def __init__(self, what: str, where: str | None, fix: str | None, pass_name: str,
                 reproducer: Path):
        self.pass_name = pass_name
        self.reproducer = reproducer
        super().__init__(what, where, fix)


class PassManager:
    """Runs `pipeline` (a pipeline string or configured passes) over a graph.

    `dump`: "all" (after every pass), "changed" (after passes that changed the graph) or a set of
    pass names; dumps are written only when `dump_dir` is given. `log` receives one line per pass.
    """

    def __init__(self, pipeline: str | Sequence[str | Pass], dump_dir: str | Path | None = None,
                 dump: str | Iterable[str] = "all", verify: bool = True,
                 log: Callable[[str], None] | None = None):
        self.passes: list[Pass] = parse_pipeline(pipeline)
        self.pipeline = format_pipeline(self.passes)
        self.dump_dir = Path(dump_dir) if dump_dir is not None else None
        self.dump = _dump_selection(dump)
        self.verify = verify
        self.log = log
        self.records: list[PassRecord] = []

    def run(self, graph: Graph) -> Graph:
        """Run every pass in order and return the final graph (passes may mutate `graph`)."""
        self.records = []
        if self.verify:
            _verify_input(graph)
        text = print_ir(graph)
        if self.dump_dir is not None:
            self.dump_dir.mkdir(parents=True, exist_ok=True)
            self._write_dump(0, "input", f"*** IR before any pass ***\npipeline: {self.pipeline}",
                             text + describe(graph))
        with collection_paused():  # see compiler/ir/collector.py: linear time on large graphs
            for index, pass_ in enumerate(self.passes, start=1):
                graph, text = self._run_one(index, pass_, graph, text)
        return graph

    def timing_report(self) -> str:
        """A small table of the last run's records, slowest pass first."""
        total = sum(r.seconds for r in self.records) or 1.0
        lines = [f"{'pass':<36}{'ms':>10}{'%':>7}  changed  nodes"]
        for r in sorted(self.records, key=lambda r: -r.seconds):
            lines.append(f"{r.name:<36}{r.seconds * 1e3:>10.2f}{100 * r.seconds / total:>7.1f}"
                         f"  {'yes' if r.changed else 'no ':<7}  {r.nodes_before} -> "
                         f"{r.nodes_after}")
        return "\n".join(lines)

    # -- one pass -----------------------------------------------------------------------------
    def _run_one(self, index: int, pass_: Pass, graph: Graph, before: str) -> tuple[Graph, str]:
        nodes_before, since = len(graph.nodes), graph.version
        start = time.perf_counter()
        try:
            result = pass_.run(graph)
            _check_result(pass_, result)
        except DayzeroError:
            raise
        except Exception as exc:
            path = self._write_reproducer(index, pass_, before, f"{type(exc).__name__}: {exc}")
            raise PassCrashError(
                f"pass '{pass_.name}' crashed: {type(exc).__name__}: {exc}",
                f"pass {index} of {len(self.passes)} in pipeline '{self.pipeline}'",
                f"this is a bug in the pass; its input IR and pipeline are saved in {path} "
                "(rerun with --debug for the traceback)", pass_.name, path) from exc
        seconds = time.perf_counter() - start
        changed = result.changed
        if changed:  # passes edit nodes directly too: only what the pass preserves stays cached
            mark_changed(result.graph, pass_.preserves, since if result.graph is graph else 0)
        graph = result.graph
        after = print_ir(graph)
        if self.verify:
            self._verify_after(index, pass_, graph, changed, before, after)
        record = PassRecord(pass_.name, seconds, changed, nodes_before, len(graph.nodes))
        self.records.append(record)
        if self.log is not None:
            self.log(f"  {index:02d} {pass_.spec():<40} {seconds * 1e3:8.2f} ms  "
                     f"{'changed' if changed else 'unchanged'}, nodes {nodes_before} -> "
                     f"{len(graph.nodes)}")
        if self.dump_dir is not None and self._wants_dump(pass_, changed):
            header = (f"*** IR after {pass_.name} ***\npass {index} of {len(self.passes)}: "
                      f"{pass_.spec()}; {'changed' if changed else 'unchanged'}; "
                      f"nodes {nodes_before} -> {len(graph.nodes)}")
            self._write_dump(index, pass_.name, header, after + describe(graph))
        return graph, after

    def _verify_after(self, index: int, pass_: Pass, graph: Graph, changed: bool, before: str,
                      after: str) -> None:
        try:
            verify(graph)
        except VerificationError as exc:
            path = self._write_reproducer(index, pass_, before,
                                          f"invalid IR after pass: {exc.what}")
            raise VerificationError(
                f"pass '{pass_.name}' produced an invalid graph: {exc.what}", exc.where,
                f"this is a bug in pass '{pass_.name}'; its input IR and pipeline are saved in "
                f"{path}") from exc
        if not changed and before != after:
            path = self._write_reproducer(index, pass_, before, "reported changed=False but "
                                          "modified the graph")
            raise VerificationError(
                f"pass '{pass_.name}' reported changed=False but modified the graph",
                f"pass {index} of {len(self.passes)} in pipeline '{self.pipeline}'",
                f"compute `changed` from what the pass did; its input IR is saved in {path}")

    def _wants_dump(self, pass_: Pass, changed: bool) -> bool:
        if self.dump == "all":
            return True
        if self.dump == "changed":
            return changed
        return pass_.name in self.dump

    # -- files --------------------------------------------------------------------------------
    def _write_dump(self, index: int, name: str, header: str, text: str) -> Path:
        width = max(2, len(str(len(self.passes))))
        path = self.dump_dir / f"{index:0{width}d}-{name}.dzir"
        path.write_text(_comment(header) + text)
        return path

    def _write_reproducer(self, index: int, pass_: Pass, text: str, error: str) -> Path:
        folder = self.dump_dir or Path(tempfile.mkdtemp(prefix="dayzero-crash-"))
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"crash-{pass_.name}.dzir"
        header = "\n".join([
            f"dayzero crash reproducer: pass {index} of {len(self.passes)} failed",
            f"error: {error}",
            f"pipeline: {pass_.spec(full=True)}",
            f"full pipeline: {self.pipeline}",
            "this file is the pass's input IR; weights are declared by type only (no data)",
            "reproduce: from compiler.ir import parse_ir; from passes import PassManager",
            f"           PassManager({pass_.spec(full=True)!r})"
            f".run(parse_ir(open({str(path)!r}).read()))",
        ])
        path.write_text(_comment(header) + text)
        return path


def _comment(text: str) -> str:
    return "".join(f"# {line}\n" for line in text.splitlines())


def _dump_selection(dump: str | Iterable[str]) -> str | frozenset[str]:
    if dump in ("all", "changed"):
        return dump
    names = frozenset([dump] if isinstance(dump, str) else dump)
    unknown = sorted(names - set(available_passes()))
    if unknown:
        raise DayzeroError(f"cannot dump after unknown pass(es) {', '.join(unknown)}", None,
                           "use 'all', 'changed' or names from: " + ", ".join(available_passes()))
    return names


def _verify_input(graph: Graph) -> None:
    try:
        verify(graph)
    except VerificationError as exc:
        raise VerificationError(f"the input graph is invalid before any pass ran: {exc.what}",
                                exc.where, exc.fix) from exc


def _check_result(pass_: Pass, result: object) -> None:
    if not isinstance(result, PassResult) or not isinstance(result.changed, bool) \
            or not isinstance(result.graph, Graph):
        raise TypeError(f"pass {pass_.name} returned {result!r}; expected "
                        "PassResult(graph: Graph, changed: bool)")
