"""The hostile-input fuzz, long: corrupted artifacts, mutated IR text and fuzzed HTTP bodies.

One command runs the three fuzzers the test suite runs briefly (tests/runtime/test_artifact_fuzz.py,
tests/compiler/test_ir_fuzz_mutations.py, tests/serving/test_http_fuzz.py), each for `--cases`
cases, and prints their verdicts against issue 33's targets:

- artifacts (benchmarks/fuzz_artifacts.py): 0 raw exceptions, 0 hangs, 0 crashes, 0 manifest
  edits that silently change the output, over 4,000 corrupted forward and generation artifacts;
- IR text (benchmarks/fuzz_ir.py): 0 raw exceptions, 0 over-time parses, and the worst parse
  time per KB at most 2 x that of a real model's IR dump;
- HTTP (benchmarks/fuzz_http.py): 0 responses 500 (and no answer outside OpenAI's shapes) over
  5,000 fuzzed requests to a real `dayzero serve` of the generation artifact on 127.0.0.1, with
  /health's latency p99.

    python benchmarks/fuzz.py --cases 4000                 # all three (about an hour)
    python benchmarks/fuzz.py --cases 500 --only http,ir   # some

Exits 0 when every target is met.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
FUZZERS = ("artifacts", "ir", "http")


def _script(name: str) -> ModuleType:
    """benchmarks/<name>.py, loaded by path (benchmarks is not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _artifacts(args) -> int:
    return _script("fuzz_artifacts").main(["--cases", str(args.cases), "--seed", str(args.seed),
                                           "--work", str(args.work)])


def _ir(args) -> int:
    return _script("fuzz_ir").main(["--cases", str(args.cases), "--seed", str(args.seed)])


def _http(args) -> int:
    pristine = _script("fuzz_artifacts").build_pristine(args.work / "pristine")
    return _script("fuzz_http").main(["--artifact", str(pristine["generation"]),
                                      "--cases", str(args.cases), "--seed", str(args.seed)])


RUNNERS = {"artifacts": _artifacts, "ir": _ir, "http": _http}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=4000, help="cases per fuzzer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=",".join(FUZZERS),
                        help=f"a comma-separated subset of {','.join(FUZZERS)}")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "dz-fuzz",
                        help="where the pristine artifacts are built (reused between runs)")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(FUZZERS))
    if unknown:
        parser.error(f"--only: unknown fuzzer(s) {', '.join(unknown)}; choose from "
                     f"{', '.join(FUZZERS)}")
    verdicts = {}
    for name in chosen:
        print(f"== {name}: {args.cases} cases, seed {args.seed}", flush=True)
        verdicts[name] = RUNNERS[name](args)
    print("== verdicts: " + ", ".join(f"{name} {'met' if code == 0 else 'MISSED'}"
                                      for name, code in verdicts.items()))
    return 0 if all(code == 0 for code in verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
