"""Every causal LM of transformers' auto mapping, from a checkpoint folder, generating in dayzero.

Does `dayzero compile CKPT` turn a causal LM nobody here wrote into a generation artifact that
generates what transformers generates? For every class of transformers' causal-LM auto mapping
this script builds the model from its default config shrunk by the one generic table of
benchmarks/shrink_config.py (no per-architecture settings), with random weights from seed 0,
saves it with `save_pretrained`, reloads it with `from_pretrained` and has transformers generate
greedily from two prompts of different lengths (12 new tokens, stopping at the checkpoint's eos
token). The folder is then compiled by `dayzero compile CKPT` (text generation: the default for
a causal-LM folder; no tokenizer needed, generation takes token ids) and the artifact generates
from the same prompts. The new tokens are compared token for token; a first difference where
transformers' own top two scores at that step are within 1e-4 is a tie (the argmax is a coin
toss there) and counts as a pass.

    python benchmarks/generation_sweep.py                          # every architecture
    python benchmarks/generation_sweep.py --only llama,gpt_neox --timeout 180
    python benchmarks/generation_sweep.py --work /tmp/gs --json gs.jsonl --markdown gs.md

Each architecture runs in a process group of its own (`nice -n 19`, address space limited by
--memory, killed after --timeout): a child for transformers' reference and the artifact's run,
and `dayzero compile` in a process of its own. Outcomes:

- pass: every new token equal (or a tie at the first difference);
- mismatch: a first difference transformers did not decide by a hair;
- refused: dayzero stopped with a clean message (a DayzeroError: `error: ...`), at compile or run;
- crash: a raw exception (`internal error: ...`, a traceback) or a process that died;
- timeout: over --timeout seconds;
- skip: transformers itself cannot build, save, reload or generate the shrunk model;
- not causal: transformers' own logits at earlier positions change with a later token (a
  BERT-style class used without `is_decoder`), so nothing autoregressive can match it; counted
  apart, with what dayzero did with it.

`--work DIR` keeps (and reuses) each checkpoint folder and transformers' reference; `--json
FILE` appends each result as a JSON line, runs only the architectures FILE lacks (or those --only
names) and reports on all; `--markdown FILE` writes the docs/generation.md section. Tested in
tests/benchmarks/test_generation_sweep_harness.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.architecture_sweep import (  # noqa: E402
    Arch,
    architectures,
    first_line,
    randomize_zero_matrices,
    select,
)
from benchmarks.shrink_config import VOCAB, find, shrink  # noqa: E402

OUTCOMES = ("pass", "mismatch", "refused", "crash", "timeout", "skip", "not causal")
PROMPT_LENGTHS = (5, 11)
NEW_TOKENS = 12
TIE = 1e-4  # transformers' top-2 scores this close: the first difference is a tie
RESULT_TAG = "GENERATION-RESULT "


@dataclass
class Result:
    arch: str
    cls: str
    outcome: str
    cause: str = ""  # one line: the refusal, the exception, where the tokens differ
    seconds: float = 0.0


class Skip(Exception):
    """transformers itself cannot build, save, reload or generate the shrunk model."""


class NotCausal(Exception):  # transformers' own logits are not causal as configured
    pass


# -- token comparison ---------------------------------------------------------------------------

def compare_tokens(got: list[int], want: list[int], gaps: list[float]) -> tuple[str, str]:
    """("pass" | "tie" | "mismatch", where): dayzero's new tokens `got` against transformers'
    `want`, whose step i chose its token with a top-1 minus top-2 score of `gaps[i]`."""
    for i in range(max(len(got), len(want))):
        a = got[i] if i < len(got) else None
        b = want[i] if i < len(want) else None
        if a == b:
            continue
        gap = gaps[i] if i < len(gaps) else math.inf
        if a is not None and b is not None and gap <= TIE:  # NaN is no tie
            return "tie", f"tie at new token {i} (transformers' top-2 within {gap:.2g})"
        why = "a logit processor forced it" if gap == math.inf and b is not None else \
            f"top-2 gap {gap:.3g}"  # one finite score left: the generation config's doing
        return "mismatch", f"new token {i}: dayzero {_token(a)}, transformers {_token(b)} ({why})"
    return "pass", ""


def _token(t: int | None) -> str:  # a row that stopped (at eos) has no token there
    return "stopped" if t is None else str(t)


def classify_compile(returncode: int, stderr: str) -> tuple[str, str] | None:
    """None when `dayzero compile` succeeded, else (outcome, cause): a clean DayzeroError
    (`error: ...`, its first line) is refused; anything else (`internal error: ...`, a
    traceback, a signal) is a crash."""
    if returncode == 0:
        return None
    lines = [line for line in stderr.splitlines() if line.strip()]
    for prefix, outcome in (("error: ", "refused"), ("internal error: ", "crash")):
        found = next((line for line in lines if line.startswith(prefix)), None)
        if found is not None:
            return outcome, found[len(prefix):][:300]
    how = f"signal {-returncode}" if returncode < 0 else f"exit status {returncode}"
    return "crash", f"compile died ({how}): {(lines or ['no output'])[-1][:200]}"


# -- transformers' side -------------------------------------------------------------------------

def prompts(vocab: int, special: set[int]) -> list[list[int]]:
    """The two prompts: seeded token ids, none of them a special token."""
    import numpy as np

    pool = [t for t in range(vocab) if t not in special]
    rng = np.random.default_rng(0)
    return [[int(t) for t in rng.choice(pool, n)] for n in PROMPT_LENGTHS]


def build_checkpoint(arch: Arch, folder: Path) -> None:
    """The shrunk model with seeded random weights, saved into `folder`; Skip when transformers
    cannot build or save it."""
    import torch
    import transformers

    try:
        cls = getattr(transformers, arch.cls)
        config = shrink(cls.config_class())
        torch.manual_seed(0)
        model = cls(config).eval()
        randomize_zero_matrices(model)
    except Exception as e:  # noqa: BLE001 - transformers' own failure, counted apart
        raise Skip(f"build: {type(e).__name__}: {first_line(e)}") from e
    try:
        model.save_pretrained(folder)
    except Exception as e:  # noqa: BLE001
        raise Skip(f"save: {type(e).__name__}: {first_line(e)}") from e


def reference(arch: Arch, folder: Path) -> dict[str, Any]:
    """transformers' greedy generation from the reloaded folder: the prompts, each one's new
    tokens and the top-2 score gap of every step. Skip when it cannot reload or generate;
    NotCausal when changing the last prompt token changes the logits before it."""
    import torch
    import transformers

    try:
        model = getattr(transformers, arch.cls).from_pretrained(folder).eval()
    except Exception as e:  # noqa: BLE001
        raise Skip(f"reload: {type(e).__name__}: {first_line(e)}") from e
    config = model.generation_config
    eos = config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    special = {t for t in (*eos, config.pad_token_id, config.bos_token_id) if isinstance(t, int)}
    embeddings = model.get_input_embeddings()
    vocab = getattr(embeddings, "num_embeddings", None) or find(model.config, "vocab_size", VOCAB)
    runs = []
    try:
        for prompt in prompts(min(vocab, VOCAB), special):
            runs.append(_generate(model, prompt, eos))
        causal = _causal(model, runs[-1]["prompt"])
    except Exception as e:  # noqa: BLE001
        raise Skip(f"generate: {type(e).__name__}: {first_line(e)}") from e
    if causal is not None:
        raise NotCausal(causal)
    return {"eos": eos, "runs": runs, "transformers": transformers.__version__,
            "torch": torch.__version__}


def _generate(model: Any, prompt: list[int], eos: list[int]) -> dict[str, Any]:
    import torch

    ids = torch.tensor([prompt])
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else (eos[0] if eos else 0)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             num_beams=1, max_new_tokens=NEW_TOKENS, pad_token_id=pad,
                             output_scores=True, return_dict_in_generate=True)
    new = [int(t) for t in out.sequences[0, len(prompt):]]
    gaps = []
    for scores in out.scores:
        top = torch.topk(scores[0].double(), 2).values
        gaps.append(float(top[0] - top[1]))
    return {"prompt": prompt, "tokens": new, "gaps": gaps}


def _causal(model: Any, prompt: list[int]) -> str | None:
    """None, or why the model's logits are not causal: the logits at every position but the
    last change when only the last token does."""
    import torch

    ids = torch.tensor([prompt])
    other = ids.clone()
    other[0, -1] = prompt[0] if prompt[0] != prompt[-1] else prompt[1]
    with torch.no_grad():
        a, b = (_logits(model(input_ids=x, attention_mask=torch.ones_like(x)))[:, :-1].double()
                for x in (ids, other))
    diff = float((a - b).abs().max())
    if diff > 1e-5 * max(1.0, float(a.abs().max())):
        return (f"transformers' logits at earlier positions change by {diff:.3g} with the last "
                "token (not causal as configured)")
    return None


def _logits(out: Any) -> Any:
    return out.logits if hasattr(out, "logits") else out[0]


# -- dayzero's side -----------------------------------------------------------------------------

def compile_checkpoint(folder: Path, out: Path, timeout: float) -> tuple[str, str] | None:
    """`dayzero compile folder -o out`: None when it compiled, else (outcome, cause). The
    `dayzero` command line (compiler.cli) run as a module from ROOT: this tree's code, even
    where the installed `dayzero` script points at another checkout."""
    command = [sys.executable, "-m", "compiler.cli", "compile", str(folder), "-o", str(out),
               "--force", "-q"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              cwd=ROOT)
    except subprocess.TimeoutExpired:
        return "timeout", f"compile over {timeout:.0f} s"
    return classify_compile(done.returncode, done.stderr)


def run_artifact(path: Path, ref: dict[str, Any]) -> tuple[str, str]:
    """(outcome, cause) of the artifact's greedy generation against transformers'."""
    import numpy as np

    import runtime
    from compiler.errors import DayzeroError

    try:
        model = runtime.load(path)
        got = []
        for run in ref["runs"]:
            ids = np.asarray([run["prompt"]], dtype=np.int64)
            out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
            got.append([int(t) for t in np.asarray(out)[0, len(run["prompt"]):]])
    except DayzeroError as e:
        return "refused", "at run: " + first_line(e)
    except Exception as e:  # noqa: BLE001 - the outcome being measured
        return "crash", f"at run: {type(e).__name__}: {first_line(e)}"
    ties = []
    for run, tokens in zip(ref["runs"], got, strict=True):
        verdict, where = compare_tokens(tokens, run["tokens"], run["gaps"])
        if verdict == "mismatch":
            return "mismatch", f"prompt of {len(run['prompt'])}: {where}"
        if verdict == "tie":
            ties.append(f"prompt of {len(run['prompt'])}: {where}")
    return "pass", "; ".join(ties)


def check_architecture(arch: Arch, work: Path, timeout: float) -> Result:
    """Reference (reused from `work` when there), compile, run and compare one architecture."""
    start = time.monotonic()
    folder, ckpt = work / arch.model_type, work / arch.model_type / "ckpt"
    folder.mkdir(parents=True, exist_ok=True)
    ref = _reference_cached(arch, folder, ckpt)
    if "skip" in ref:
        return _timed(Result(arch.name, arch.cls, "skip", ref["skip"]), start)
    left = timeout - (time.monotonic() - start)
    failed = compile_checkpoint(ckpt, folder / "model.dz", left)
    if "not_causal" in ref:
        what = f"dayzero refused: {failed[1]}" if failed and failed[0] == "refused" else \
            f"dayzero: {failed[0]}: {failed[1]}" if failed else "dayzero compiled it (no refusal)"
        return _timed(Result(arch.name, arch.cls, "not causal", f"{what}"), start)
    if failed:
        return _timed(Result(arch.name, arch.cls, *failed), start)
    return _timed(Result(arch.name, arch.cls, *run_artifact(folder / "model.dz", ref)), start)


def _reference_cached(arch: Arch, folder: Path, ckpt: Path) -> dict[str, Any]:
    saved = folder / "reference.json"
    if saved.is_file() and (ckpt / "config.json").is_file():
        return json.loads(saved.read_text())
    try:
        build_checkpoint(arch, ckpt)
        ref = reference(arch, ckpt)
    except Skip as e:
        ref = {"skip": str(e)}
    except NotCausal as e:
        ref = {"not_causal": str(e)}
    saved.write_text(json.dumps(ref))
    return ref


def _timed(result: Result, start: float) -> Result:
    result.seconds = round(time.monotonic() - start, 1)
    return result


# -- the sweep: one niced, memory-limited process group per architecture ------------------------

def run_isolated(arch: Arch, work: Path, timeout: float, memory_gib: float) -> Result:
    """check_architecture in a fresh `nice -n 19` interpreter whose group (the compile
    included) is killed after `timeout` seconds; a child that dies without a result line is a
    crash naming how it died, or a skip when it died in transformers (no reference yet)."""
    start = time.monotonic()
    command = ["nice", "-n", "19", sys.executable, str(Path(__file__).resolve()), "--one",
               arch.name, "--work", str(work), "--timeout", str(timeout)]
    limit = int(memory_gib * 2 ** 30)
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=ROOT, start_new_session=True,
                             preexec_fn=lambda: _limit_memory(limit))
    try:
        # the child bounds its compile by what is left of `timeout`: a grace for its report
        stdout, stderr = child.communicate(timeout=timeout + min(15.0, timeout / 10))
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        result = Result(arch.name, arch.cls, "timeout", f"over {timeout:g} s")
    else:
        result = parse_result(arch, child.returncode, stdout, stderr, 0.0)
    if result.outcome in ("timeout", "crash") and \
            not (work / arch.model_type / "reference.json").is_file():
        # it died before transformers' reference was written: transformers' doing
        result = Result(arch.name, arch.cls, "skip", f"transformers: {result.cause}")
    result.seconds = round(time.monotonic() - start, 1)
    return result


def _limit_memory(limit: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def parse_result(arch: Arch, returncode: int, stdout: str, stderr: str, seconds: float) -> Result:
    """The Result the child printed on its tagged line, else a crash saying how it died."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            result = Result(**json.loads(line[len(RESULT_TAG):]))
            result.seconds = seconds
            return result
    how = f"signal {-returncode}" if returncode < 0 else f"exit status {returncode}"
    last = (stderr.strip().splitlines() or ["no output"])[-1][:200]
    return Result(arch.name, arch.cls, "crash", f"process died ({how}): {last}", seconds)


def sweep(archs: list[Arch], work: Path, timeout: float, memory_gib: float, jobs: int,
          on_result: Callable[[Result], None] = lambda r: None) -> list[Result]:
    def one(arch: Arch) -> Result:
        result = run_isolated(arch, work, timeout, memory_gib)
        on_result(result)
        return result

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, archs))


# -- reports ------------------------------------------------------------------------------------

def summary(results: list[Result]) -> str:
    """The totals line: each outcome's count, and passes over the architectures compared
    (those transformers generates that are causal)."""
    c = Counter(r.outcome for r in results)
    compared = sum(c[o] for o in OUTCOMES[:5])
    share = f"{100 * c['pass'] / compared:.1f}%" if compared else "-"
    counts = ", ".join(f"{c[o]} {o}" for o in OUTCOMES)
    return f"{len(results)} architectures: {counts}; pass {c['pass']} of {compared} ({share})"


def refusals_by_cause(results: list[Result]) -> list[tuple[str, list[str]]]:
    """Refusals and crashes grouped by their message with what varies by model blanked (the
    class torch.export traced, paths and source lines, node names, numbers, quoted names),
    the largest group first."""
    import re

    groups: dict[str, list[str]] = {}
    for r in results:
        if r.outcome in ("refused", "crash"):
            key = re.sub(r"(?<=trace )\w+|\S+\.py:\d+|\S*/\S+|%\S+|\d+|'[^']*'|`[^`]*`", "_",
                         r.cause)[:160]
            groups.setdefault(f"{r.outcome}: {key}", []).append(r.arch.split("/", 1)[-1])
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def markdown(results: list[Result], command: str) -> str:
    """The docs/generation.md section: command, date, machine, totals, one row each."""
    import transformers

    lines = ["## The generation sweep", "",
             f"`{command}` on {time.strftime('%Y-%m-%d')}, {machine()}, transformers "
             f"{transformers.__version__}: each causal-LM architecture of transformers' auto "
             "mapping, shrunk by benchmarks/shrink_config.py's one table, random weights, saved "
             "and compiled with `dayzero compile CKPT`, greedy generation from prompts of "
             f"{' and '.join(map(str, PROMPT_LENGTHS))} tokens ({NEW_TOKENS} new, stopping at "
             "eos) compared with transformers' `generate` token for token (a first difference "
             f"where transformers' top-2 scores are within {TIE:g} is a tie, a pass).", "",
             summary(results) + ".", "",
             "| architecture | class | outcome | detail |", "|---|---|---|---|"]
    for r in sorted(results, key=lambda r: r.arch):
        lines.append(f"| {r.arch.split('/', 1)[-1]} | {r.cls} | {r.outcome} | "
                     f"{r.cause.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def machine() -> str:
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        pages = 0
    return (f"{platform.machine()} {os.cpu_count()} CPU cores"
            + (f", {pages / 2 ** 30:.0f} GiB" if pages else ""))


def recorded(path: Path | None) -> dict[str, Result]:
    """Each architecture's latest result in a JSON-lines file (none when there is none)."""
    if path is None or not path.is_file():
        return {}
    rows = [Result(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    return {r.arch: r for r in rows}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    archs = architectures(["causal-lm"])
    if args.one:
        return _child(next(a for a in archs if a.name == args.one), args)
    archs = select(archs, args.only, args.limit)
    done = recorded(args.json)
    if not args.only:
        archs = [a for a in archs if a.name not in done]
    with tempfile.TemporaryDirectory(prefix="dz-gensweep-") as tmp:
        work = (args.work or Path(tmp)).resolve()
        print(f"{len(archs)} architectures, {args.jobs} at a time, {args.timeout:g} s each, work "
              f"{work}" + (f"; {len(done)} recorded in {args.json}" if done else ""), flush=True)
        results = sweep(archs, work, args.timeout, args.memory, max(1, args.jobs),
                        lambda r: _progress(r, args.json))
    results = list({**done, **{r.arch: r for r in results}}.values())
    print("\n" + summary(results))
    for cause, names in refusals_by_cause(results):
        print(f"  {len(names):3d}  {cause}\n       {', '.join(names)}")
    if args.markdown:
        shown = " ".join(["python benchmarks/generation_sweep.py", *(argv or sys.argv[1:])])
        args.markdown.write_text(markdown(results, shown))
        print(f"wrote {args.markdown}")
    return 0


def _progress(r: Result, json_path: Path | None) -> None:
    print(f"{r.arch.split('/', 1)[-1]:<28} {r.outcome:<10} {r.seconds:6.1f}s  {r.cause[:160]}",
          flush=True)
    if json_path:
        with json_path.open("a") as f:
            f.write(json.dumps(asdict(r)) + "\n")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", help="comma-separated model types or class names")
    p.add_argument("--limit", type=int, help="the first N architectures only")
    p.add_argument("--jobs", type=int, default=1, help="architectures at a time")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per architecture")
    p.add_argument("--memory", type=float, default=8.0, help="GiB of address space each")
    p.add_argument("--work", type=Path, help="keep and reuse checkpoints and references here")
    p.add_argument("--json", type=Path, help="append results here; skip those recorded")
    p.add_argument("--markdown", type=Path, help="write the docs/generation.md section here")
    p.add_argument("--one", help=argparse.SUPPRESS)  # the child: one architecture
    return p


def _child(arch: Arch, args: argparse.Namespace) -> int:
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    result = check_architecture(arch, args.work, args.timeout)
    print(RESULT_TAG + json.dumps(asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
