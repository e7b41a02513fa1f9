"""Every architecture of transformers' auto mappings, shrunk, on onnxruntime against eager.

Which architectures does dayzero compile on day zero, with no model code? This script takes every
class of transformers' causal-LM, masked-LM and image-classification auto mappings, builds it from
its default config shrunk by one generic table (benchmarks/shrink_config.py: hidden 64, 2 layers,
4 heads, 4 experts top-2, ... applied to every nested sub-config alike, no per-model code) with
random weights in eval mode, and runs it eagerly. Those that build and run are compiled with
`compiler.compile` on onnxruntime (a dynamic sequence dim; images at a fixed size), each in its
own subprocess with a time limit, and compared with eager at two sequence lengths within
1e-3 x max(1, max |eager|).

    python benchmarks/architecture_sweep.py                      # every architecture
    python benchmarks/architecture_sweep.py --only llama,bert,vit --timeout 120
    python benchmarks/architecture_sweep.py --write-docs         # and the table into docs/ops.md
    python benchmarks/architecture_sweep.py --resume R.jsonl --write-docs  # continue a sweep
    python benchmarks/architecture_sweep.py --only jetmoe --resume R.jsonl --write-docs

`--resume FILE` keeps a sweep's results in a JSON-lines file: each result is appended as it
comes, architectures already there are not run again (an interrupted sweep continues), except
those named by `--only`, which run again and replace their line (the rerun after a fix). The
report and the docs table cover every result in the file, each architecture's latest.

Outcomes: match, mismatch, compile error (the first line of the message; the ops when some are
unsupported), timeout, no eager (the shrunk model does not build or run in transformers itself).
It prints counts per outcome and per mapping and the failures grouped by cause. `--write-docs`
writes the table into its own marked section of docs/ops.md, which `python -m
compiler.frontend.opdoc` keeps (it rewrites only its own markers). A fixed sample runs in CI
(tests/architectures/test_sample.py) through `check_architecture`; the bookkeeping is tested in
tests/benchmarks/test_architecture_sweep_harness.py.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.shrink_config import VOCAB, find, shrink  # noqa: E402

DOC = ROOT / "docs" / "ops.md"
BEGIN = ("<!-- BEGIN ARCHITECTURE SWEEP written by `python benchmarks/architecture_sweep.py "
         "--write-docs`; do not edit by hand -->")
END = "<!-- END ARCHITECTURE SWEEP -->"

# mapping label -> transformers.models.auto.modeling_auto table
MAPPINGS = {
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "image-classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
}
OUTCOMES = ("match", "mismatch", "compile error", "timeout", "no eager")
# compiled at the first, compared at both; where torch.export finds no graph dynamic in the
# sequence (state-space models), compiled at both sizes into one artifact (compile's
# static_sizes, the sizes this caller runs: a static-size artifact runs exact sizes only)
SEQ_LENGTHS = (8, 13)
MAX_SEQ = 64
TOLERANCE = 1e-3  # x max(1, max |eager|)
RESULT_TAG = "ARCHITECTURE-RESULT "




@dataclass(frozen=True)
class Arch:
    """One class of one auto mapping: `mapping/model_type` names it."""

    mapping: str
    model_type: str
    cls: str

    @property
    def name(self) -> str:
        return f"{self.mapping}/{self.model_type}"


@dataclass
class Result:
    arch: str
    cls: str
    outcome: str
    cause: str = ""  # one line; failures are grouped by it
    max_diff: float | None = None
    seconds: float = 0.0


def architectures(mappings: Iterable[str] = MAPPINGS) -> list[Arch]:
    """Every (mapping, model type, class) of the chosen auto mappings, in mapping order; where a
    mapping lists several classes for one model type (DeiT, LeViT, Perceiver), the first."""
    from transformers.models.auto import modeling_auto

    return [Arch(label, model_type, cls if isinstance(cls, str) else cls[0])
            for label in mappings
            for model_type, cls in getattr(modeling_auto, MAPPINGS[label]).items()]


def select(archs: list[Arch], only: str | None, limit: int | None) -> list[Arch]:
    """Those named in `only` (model types, class names or mapping/model_type), then the first
    `limit`; a name matching nothing is an error, so a typo cannot pass as an empty sweep."""
    if only:
        names = [n.strip() for n in only.split(",") if n.strip()]
        unknown = [n for n in names if not any(_named(a, n) for a in archs)]
        if unknown:
            raise SystemExit(f"--only: no architecture named {', '.join(unknown)} (use a model "
                             "type such as llama, a class name or causal-lm/llama)")
        archs = [a for a in archs if any(_named(a, n) for n in names)]
    return archs[:limit] if limit else archs


def _named(arch: Arch, name: str) -> bool:
    return name.lower() in (arch.model_type.lower(), arch.cls.lower(), arch.name.lower())



# -- one architecture ---------------------------------------------------------------------------

class NoEager(Exception):
    """The shrunk model does not build or run in transformers itself."""


def build(arch: Arch) -> tuple[Any, tuple, Any]:
    """The wrapped module (one tensor out), its example inputs and dynamic shapes, eval mode,
    random weights from seed 0; NoEager when transformers cannot build or run it."""
    import torch
    import transformers
    from torch.export import Dim

    from compiler.hf_models import wrap_pretrained

    try:
        cls = getattr(transformers, arch.cls)
        config = shrink(cls.config_class())
        torch.manual_seed(0)
        model = cls(config).eval()
        randomize_zero_matrices(model)
        inputs = _inputs(arch, config, SEQ_LENGTHS[0])
        module, values = wrap_pretrained(model, inputs, arch.cls)
        with torch.no_grad():
            module(*values)
    except Exception as e:  # noqa: BLE001 - any failure here is transformers', counted apart
        raise NoEager(first_line(e)) from e
    if arch.mapping == "image-classification":
        return module, values, None
    return module, values, ({1: Dim("seq", min=2, max=MAX_SEQ)},)


def randomize_zero_matrices(model: Any, std: float = 0.02) -> list[str]:
    """Weights of rank >= 2 that the model's init left all zero get normal(0, std) values; their
    names. A zero router gate (AFMoE's init) scores every expert alike, and the order topk picks
    among equal scores is unspecified (torch's CPU kernel and onnxruntime's differ), so such a
    model compared the tie-breaking, not the compile. Trained weights have no all-zero matrices;
    vectors (biases, norm scales, expert biases) keep their init."""
    import torch

    names = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and p.is_floating_point() and not p.any():
                p.normal_(0.0, std)
                names.append(name)
    return names


def _inputs(arch: Arch, config: Any, seq: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seq)
    if arch.mapping == "image-classification":
        size = find(config, "image_size", 64)
        h, w = (size, size) if isinstance(size, int) else size
        channels = find(config, "num_channels", 3)
        return {"pixel_values": torch.randn(1, channels, h, w, generator=g)}
    vocab = find(config, "vocab_size", VOCAB)
    return {"input_ids": torch.randint(0, vocab, (1, seq), generator=g)}


def first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:200]


def compile_cause(error: BaseException) -> str:
    """The cause a compile error is grouped by: the unsupported ops, else the error's class and
    the first line of its message with numbers and quoted names blanked (they vary by model)."""
    ops = getattr(error, "ops", None)
    if isinstance(ops, dict) and ops:
        return "unsupported: " + ", ".join(sorted(ops))
    line = re.sub(r"\d+", "N", first_line(error))
    line = re.sub(r"'[^']*'|`[^`]*`", "'...'", line)
    return f"{type(error).__name__}: {line}"


def compare(got: Any, want: Any) -> tuple[bool, float]:
    """Within TOLERANCE x max(1, max |eager|), NaN where eager has NaN; the largest difference."""
    import numpy as np

    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return False, float("inf")
    if not np.array_equal(np.isnan(got), np.isnan(want)):
        return False, float("nan")
    finite = ~np.isnan(want)
    if not finite.any():
        return True, 0.0
    with np.errstate(invalid="ignore"):  # inf - inf: equal infinities count as no difference
        diff = np.where(got[finite] == want[finite], 0.0, np.abs(got[finite] - want[finite]))
    scale = max(1.0, float(np.max(np.abs(want[finite][np.isfinite(want[finite])]), initial=0.0)))
    worst = float(diff.max(initial=0.0))
    return bool(worst <= TOLERANCE * scale), worst


def check_architecture(arch: Arch, workdir: str | Path) -> Result:
    """Build, run eagerly, compile on onnxruntime into `workdir` and compare at every size."""
    import torch

    import compiler
    import runtime

    start = time.perf_counter()
    result = Result(arch.name, arch.cls, "match")
    try:
        module, values, dynamic = build(arch)
    except NoEager as e:
        result.outcome, result.cause = "no eager", str(e)
        return _timed(result, start)
    try:
        path = compiler.compile(module, values, out=Path(workdir) / f"{arch.model_type}.dz",
                                backend="onnxruntime", dynamic_shapes=dynamic, force=True,
                                static_sizes=list(SEQ_LENGTHS) if dynamic else None)
        loaded = runtime.load(path)
    except Exception as e:  # noqa: BLE001 - the outcome being measured
        result.outcome, result.cause = "compile error", compile_cause(e)
        return _timed(result, start)
    config = module.model.config
    lengths = SEQ_LENGTHS if dynamic else SEQ_LENGTHS[:1]
    worst = 0.0
    for seq in lengths:
        inputs = tuple(_inputs(arch, config, seq).values())
        with torch.no_grad():
            want = module(*inputs)
        try:
            got = loaded(*inputs)[0]
        except Exception as e:  # noqa: BLE001
            result.outcome, result.cause = "compile error", "at run: " + compile_cause(e)
            return _timed(result, start)
        ok, diff = compare(got, want)
        worst = diff if diff != diff or diff > worst else worst
        if not ok:
            result.outcome = "mismatch"
            result.cause = f"max |diff| {diff:.3g} at size {seq}"
    result.max_diff = worst
    return _timed(result, start)


def _timed(result: Result, start: float) -> Result:
    result.seconds = round(time.perf_counter() - start, 1)
    return result


# -- the sweep: one subprocess per architecture -------------------------------------------------

def run_isolated(arch: Arch, timeout: float) -> Result:
    """check_architecture in a fresh interpreter, killed after `timeout` seconds; a process that
    dies without a result (a native crash, out of memory) is a compile error naming its exit."""
    start = time.perf_counter()
    command = [sys.executable, str(Path(__file__).resolve()), "--one", arch.name]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return Result(arch.name, arch.cls, "timeout", f"over {timeout:g} s",
                      seconds=round(time.perf_counter() - start, 1))
    return parse_result(arch, done.returncode, done.stdout, done.stderr,
                        round(time.perf_counter() - start, 1))


def parse_result(arch: Arch, returncode: int, stdout: str, stderr: str, seconds: float) -> Result:
    """The Result the child printed on its tagged line, else a compile error saying how it died."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            result = Result(**json.loads(line[len(RESULT_TAG):]))
            result.seconds = seconds
            return result
    last = (stderr.strip().splitlines() or [f"exit status {returncode}"])[-1][:200]
    return Result(arch.name, arch.cls, "compile error",
                  f"process died (exit status {returncode}): {last}", seconds=seconds)


def sweep(archs: list[Arch], timeout: float, jobs: int,
          on_result: Callable[[Result], None] = lambda r: None) -> list[Result]:
    """Every architecture through run_isolated, `jobs` at a time, in the order given."""
    def one(arch: Arch) -> Result:
        result = run_isolated(arch, timeout)
        on_result(result)
        return result

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, archs))


# -- reports ------------------------------------------------------------------------------------

def counts(results: list[Result]) -> dict[str, Counter]:
    """Outcome counts per mapping, and over all under "all"."""
    table: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        table[r.arch.split("/", 1)[0]][r.outcome] += 1
        table["all"][r.outcome] += 1
    return table


def match_rate(results: list[Result]) -> tuple[int, int]:
    """(matches, architectures whose eager forward runs): the issue's target ratio."""
    ran = [r for r in results if r.outcome != "no eager"]
    return sum(r.outcome == "match" for r in ran), len(ran)


def failures_by_cause(results: list[Result]) -> dict[str, list[Result]]:
    """Every result other than match, grouped by (outcome, cause), the largest group first."""
    groups: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        if r.outcome != "match":
            cause = r.cause if r.outcome != "mismatch" else "outputs differ from eager"
            groups[f"{r.outcome}: {cause}"].append(r)
    return dict(sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])))


def counts_table(results: list[Result]) -> list[str]:
    table = counts(results)
    rows = ["| mapping | " + " | ".join(OUTCOMES) + " | total |",
            "|---|" + "---:|" * (len(OUTCOMES) + 1)]
    for mapping in [m for m in MAPPINGS if m in table] + ["all"]:
        c = table[mapping]
        rows.append(f"| {mapping} | " + " | ".join(str(c[o]) for o in OUTCOMES)
                    + f" | {sum(c.values())} |")
    return rows


def report(results: list[Result]) -> str:
    matched, ran = match_rate(results)
    lines = counts_table(results)
    share = f"{100 * matched / ran:.1f}%" if ran else "-"  # 256 of 257 is not 100%
    lines += ["", f"compile and match: {matched} of {ran} architectures that run eagerly ({share})"]
    groups = failures_by_cause(results)
    if groups:
        lines += ["", "failures by cause:"]
    for cause, members in groups.items():
        lines.append(f"  {len(members):3d}  {cause}")
        lines.append("       " + ", ".join(r.cls for r in members))
    return "\n".join(lines)


def docs_section(results: list[Result], command: str, total: int,
                 rerun: str | None = None) -> str:
    """The docs/ops.md section, markers included: counts and one row per architecture of the
    `total` the mappings hold. `rerun` names the results file a `--resume --only` run updated:
    the table is that file's, with only the named architectures run by this command."""
    import transformers

    matched, ran = match_rate(results)
    chosen = "every architecture" if len(results) == total else \
        f"{len(results)} of the {total} architectures"
    lines = [BEGIN, "", "## Architecture sweep", "",
             f"`{command}` with transformers {transformers.__version__}"
             + (f" (reran those `--only` names; the other rows are {rerun}'s)" if rerun else "")
             + f": {chosen} of its "
             "causal-LM, masked-LM and image-classification auto mappings, built from its "
             "default config shrunk by one generic table (hidden 64, 2 layers, 4 heads, 4 experts "
             "top-2), compiled on onnxruntime and compared with eager at sequence lengths "
             f"{' and '.join(map(str, SEQ_LENGTHS))} (images: one fixed size) within "
             f"{TOLERANCE:g} x max(1, max |eager|). {matched} of the {ran} architectures whose "
             "eager forward runs compile and match.", ""]
    lines += counts_table(results)
    lines += ["", "| architecture | class | outcome | cause |", "|---|---|---|---|"]
    for r in sorted(results, key=lambda r: r.arch):
        cause = r.cause.replace("|", "\\|")
        lines.append(f"| {r.arch} | {r.cls} | {r.outcome} | {cause} |")
    lines += ["", END]
    return "\n".join(lines)


def write_docs(text: str, section: str) -> str:
    """`text` with its sweep section replaced, or appended when it has none; the rest, the
    op tables `compiler.frontend.opdoc` generates included, is kept as it is."""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        return head + section + rest.split(END, 1)[1]
    return text.rstrip("\n") + "\n\n" + section + "\n"


def recorded_command(argv: list[str]) -> str:
    """The command line the docs show: this run's, less --write-docs and --json FILE (a
    private path)."""
    shown, skip = [], False
    for arg in argv:
        if skip or arg == "--write-docs" or arg.startswith("--json="):
            skip = False
            continue
        skip = arg == "--json"
        if not skip:
            shown.append(arg)
    return " ".join(["python benchmarks/architecture_sweep.py", *shown])


def recorded_results(path: Path) -> dict[str, Result]:
    """Each architecture's latest result in a JSON-lines file (none when it does not exist)."""
    if not path.exists():
        return {}
    results = [Result(**json.loads(line)) for line in path.read_text().splitlines() if line]
    return {r.arch: r for r in results}


def to_run(archs: list[Arch], recorded: dict[str, Result], only: str | None) -> list[Arch]:
    """The selected architectures a resumed sweep runs: all when named by --only, else those
    without a recorded result."""
    return archs if only else [a for a in archs if a.name not in recorded]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated model types or class names")
    parser.add_argument("--limit", type=int, help="the first N architectures only")
    parser.add_argument("--jobs", type=int, default=1, help="architectures at a time")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per architecture")
    parser.add_argument("--write-docs", action="store_true", help="write the table into "
                        "docs/ops.md")
    parser.add_argument("--json", type=Path, help="append each result to this JSON-lines file")
    parser.add_argument("--resume", type=Path, help="a JSON-lines file of results: run only "
                        "the architectures it lacks (or those --only names), append theirs, "
                        "report on all of them")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child: one architecture
    args = parser.parse_args(argv)
    archs = architectures()
    if args.one:
        return _child(next(a for a in archs if a.name == args.one))
    archs = select(archs, args.only, args.limit)
    recorded = recorded_results(args.resume) if args.resume else {}
    archs = to_run(archs, recorded, args.only)

    def progress(r: Result) -> None:
        print(f"{r.arch:<40} {r.outcome:<14} {r.seconds:6.1f}s  {r.cause[:100]}", flush=True)
        for path in {args.json, args.resume} - {None}:
            with path.open("a") as f:
                f.write(json.dumps(asdict(r)) + "\n")

    print(f"{len(archs)} architectures, {args.jobs} at a time, {args.timeout:g} s each"
          + (f"; {len(recorded)} recorded in {args.resume}" if recorded else ""), flush=True)
    results = sweep(archs, args.timeout, max(1, args.jobs), progress)
    if args.resume:
        results = list({**recorded, **{r.arch: r for r in results}}.values())
    print()
    print(report(results))
    if args.write_docs:
        command = recorded_command(argv if argv is not None else sys.argv[1:])
        rerun = str(args.resume) if args.resume and args.only else None
        section = docs_section(results, command, len(architectures()), rerun)
        DOC.write_text(write_docs(DOC.read_text(), section))
        print(f"wrote the table into {DOC.relative_to(ROOT)}")
    return 0


def _child(arch: Arch) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory(prefix="dz-sweep-") as tmp:
        result = check_architecture(arch, tmp)
    print(RESULT_TAG + json.dumps(asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
