"""Compile time against model depth: is every stage of dayzero's own linear in the node count?

Builds the tiny-width Llama decoder of examples/llama.py (transformers' LlamaForCausalLM, hidden
64, random weights, nothing downloaded) at several depths and compiles it the way
`compiler.driver.lower_and_write` does for the default (onnxruntime) backend, timing each stage
on its own: torch.export (torch's work, reported for scale only), conversion to IR, every pass
of the backend's default pipeline, the pass manager's own verify-and-print after each pass,
lowering, and writing the artifact. Each time is the minimum of `--repeat` runs.

    python benchmarks/compile_scale.py                           # 2, 8, 32, 128 layers, 3 runs
    python benchmarks/compile_scale.py --layers 2,8,32 --repeat 1

For each stage it prints (t_big / t_small) / (n_big / n_small) between the two largest depths:
1.0 is linear; a stage of dayzero's own passes below 1.3 (issue 17). Exit status 1 when one
does not. Stages shorter than 50 ms at the largest depth are within timer and GC noise on a
shared machine: too small to judge, they pass.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from compiler.frontend.export import _trace, convert_program  # noqa: E402
from compiler.writer import write_artifact  # noqa: E402
from passes import PassManager, parse_pipeline  # noqa: E402
from passes.fusion.decompose import decompose_unsupported  # noqa: E402
from passes.plan_memory import memory_plan_for  # noqa: E402

LIMIT = 1.3
TOO_SMALL_S = 0.05
TORCH_STAGES = {"torch.export"}


def _llama_example():
    spec = importlib.util.spec_from_file_location("example_llama", ROOT / "examples" / "llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _TimedBackend:
    """The backend, with the time its `lower` takes recorded (the rest of the write is I/O)."""

    def __init__(self, backend):
        self._backend = backend
        self.seconds = 0.0

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def lower(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self._backend.lower(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


def compile_once(layers: int, out: Path) -> tuple[int, dict[str, float]]:
    """Compile the decoder with `layers` layers; (input node count, seconds per stage)."""
    import backends

    llama = _llama_example()
    model, args, dynamic = llama._spec(llama.config(hidden=64, layers=layers), seq=8)
    times: dict[str, float] = {}
    start = time.perf_counter()
    program = _trace(model, args, dynamic)
    times["torch.export"] = time.perf_counter() - start
    start = time.perf_counter()
    graph = convert_program(program, model)
    times["convert to IR"] = time.perf_counter() - start
    nodes = len(graph.nodes)

    target = backends.get("onnxruntime")
    pipeline = parse_pipeline(target.default_pipeline)
    manager = PassManager(pipeline)
    start = time.perf_counter()
    graph = manager.run(graph)
    total = time.perf_counter() - start
    for record in manager.records:
        key = f"pass {record.name}"
        times[key] = times.get(key, 0.0) + record.seconds
    times["verify+print (manager)"] = total - sum(r.seconds for r in manager.records)

    start = time.perf_counter()
    decompose_unsupported(graph, target.supports)
    plan = memory_plan_for(pipeline, graph)
    times["prepare (decompose, plan)"] = time.perf_counter() - start
    extra = {"memory_plan": plan} if plan is not None else {}
    timed = _TimedBackend(target)
    start = time.perf_counter()
    write_artifact(out, graph, timed, force=True, manifest_extra=extra)
    times["write artifact"] = time.perf_counter() - start - timed.seconds
    times["lower (onnxruntime)"] = timed.seconds
    return nodes, times


def measure(layers: list[int], repeat: int) -> dict[int, tuple[int, dict[str, float]]]:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for depth in layers:
            best: dict[str, float] = defaultdict(lambda: float("inf"))
            nodes = 0
            for _ in range(repeat):
                nodes, times = compile_once(depth, Path(tmp) / f"llama{depth}.dz")
                for stage, seconds in times.items():
                    best[stage] = min(best[stage], seconds)
            results[depth] = (nodes, dict(best))
            print(f"  {depth} layers: {nodes} nodes, dayzero "
                  f"{sum(t for s, t in best.items() if s not in TORCH_STAGES):.2f} s",
                  file=sys.stderr, flush=True)
    return results


def report(results: dict[int, tuple[int, dict[str, float]]]) -> bool:
    depths = sorted(results)
    small, big = depths[-2], depths[-1]
    n_ratio = results[big][0] / results[small][0]
    stages = list(results[big][1])
    header = f"{'stage':<34}" + "".join(f"{f'L={d} s':>11}" for d in depths) + \
        f"{'ratio':>8}  verdict"
    print(f"{'nodes':<34}" + "".join(f"{results[d][0]:>11}" for d in depths))
    print(header)
    ok = True
    for stage in stages + ["dayzero total"]:
        if stage == "dayzero total":
            row = [sum(t for s, t in results[d][1].items() if s not in TORCH_STAGES)
                   for d in depths]
        else:
            row = [results[d][1].get(stage, 0.0) for d in depths]
        ratio = (row[-1] / row[-2]) / n_ratio if row[-2] > 0 else float("inf")
        if stage in TORCH_STAGES:
            verdict = "(torch)"
        elif row[-1] < TOO_SMALL_S:
            verdict = "PASS (small)"
        else:
            verdict = "PASS" if ratio <= LIMIT else "FAIL"
            ok &= verdict == "PASS"
        print(f"{stage:<34}" + "".join(f"{t:>11.3f}" for t in row) + f"{ratio:>8.2f}  {verdict}")
    print(f"ratio = (t{big}/t{small}) / (n{big}/n{small}); linear is 1.0, the limit {LIMIT}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="2,8,32,128",
                        help="comma-separated depths (the last two are compared)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per depth (the minimum counts)")
    args = parser.parse_args(argv)
    layers = sorted({int(x) for x in args.layers.split(",")})
    if len(layers) < 2:
        parser.error("give at least two depths")
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    return 0 if report(measure(layers, args.repeat)) else 1


if __name__ == "__main__":
    sys.exit(main())
