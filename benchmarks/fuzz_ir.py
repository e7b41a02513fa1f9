"""Mutation fuzz of the .dzir parser: hostile IR text ends in a graph or a clean error, fast.

Starts from a real model's IR (examples/llama.py:build, as `--dump-ir` writes it), mutates it
with a seeded RNG (byte flips, token duplication, dims spliced between types, hostile size
expressions such as 16-argument `Max(...)`, power towers and long sums put in dims and
attributes, lines duplicated or dropped), parses each mutant and classifies the outcome:

    parsed        parse_ir and verify accept it
    parse-error   a clean IRParseError
    other-error   another DayzeroError
    raw           any other exception (a bug: bad input must never give a traceback)
    over-time     more than --limit seconds of CPU (a bug: work must be bounded)

It reports the worst parse time per KB against the real dump's (issue 33's target: at most
2x). sympy's cache is cleared before every parse, the dump's included, so that no case is
timed warm on another's work.

    python benchmarks/fuzz_ir.py --cases 3000 --seed 0 [--dump FILE.dzir] [--save DIR]
    python benchmarks/fuzz_ir.py --write-dump tests/compiler/fuzz_cases/llama_1layer.dzir --layers 1
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import json
import random
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("parsed", "parse-error", "other-error", "raw", "over-time")


def real_dump(layers: int | None = None) -> str:
    """The IR of examples/llama.py:build as the frontend gives it (the first --dump-ir stage);
    with `layers`, of the same decoder with that many layers (smaller, for the tests)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from compiler import export
    from compiler.ir import print_ir

    spec = importlib.util.spec_from_file_location("llama_example", ROOT / "examples/llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if layers is None:
        model, args, shapes = module.build()
    else:  # build() with another layer count: the example's own spec builder
        model, args, shapes = module._spec(module.config(layers=layers), seq=8)
    return print_ir(export(model, args, shapes))


# -- hostile size expressions --------------------------------------------------------------------
_INTS = ["0", "1", "2", "7", "64", "4096", str(2**62), str(2**63), "9" * 19, "9" * 30]


def hostile_expr(rng: random.Random, symbols: list[str], chars: int = 300) -> str:
    """A random size expression of about `chars` characters over `symbols`, biased to what
    was slow or wrong once: wide Max/Min, powers, floor/Mod chains, unary minus."""
    shape = rng.choice(["wide", "wide", "random", "random", "tower", "sum", "deep"])
    atom = lambda: rng.choice(symbols) if rng.random() < 0.7 else rng.choice(_INTS[:6])  # noqa: E731
    if shape == "wide":
        fn = rng.choice(["Max", "Min"])
        args = [_poly(rng, symbols) for _ in range(rng.randint(8, 18))]
        return f"{fn}({', '.join(args)})"
    if shape == "tower":
        base = f"({' + '.join(atom() for _ in range(rng.randint(1, 8)))})"
        for _ in range(rng.randint(1, 4)):
            base = f"({base}**{rng.randint(2, 9)})"
        return base
    if shape == "sum":
        return " + ".join(f"{rng.randint(1, 99)}*{atom()}**{rng.randint(1, 3)}"
                          for _ in range(rng.randint(10, 60)))
    if shape == "deep":
        depth = rng.randint(20, 80)
        return "Max(" * depth + atom() + "".join(f", {atom()})" for _ in range(depth))
    return _random(rng, symbols, chars)


def _poly(rng: random.Random, symbols: list[str]) -> str:
    a, b, c = (rng.choice(symbols) for _ in range(3))
    return rng.choice([f"{a}*{b} - {rng.randint(1, 99)}*{c}", f"floor({a}/{rng.randint(2, 9)})"
                       f" + {b}", f"Mod({a}, {rng.randint(2, 9)})*{b}", f"{a}**2 - {b}*{c}",
                       f"{rng.randint(1, 99)} - {a}", f"-{a}**2 + {rng.randint(1, 9)}*{b}"])


def _random(rng: random.Random, symbols: list[str], chars: int) -> str:
    if chars < 8 or rng.random() < 0.15:
        return rng.choice(symbols) if rng.random() < 0.6 else rng.choice(_INTS)
    left, right = (_random(rng, symbols, chars // 2) for _ in range(2))
    return rng.choice([
        f"{left} + {right}", f"{left} - {right}", f"{left}*{right}", f"-{left}",
        f"({left})**{rng.randint(0, 9)}", f"Max({left}, {right})", f"Min({left}, {right})",
        f"floor(({left})/({right}))", f"ceiling(({left})/{rng.randint(1, 9)})",
        f"Mod({left}, {right})", f"({left})/({right})", f"({left})",
    ])


# -- mutations -----------------------------------------------------------------------------------
_TOKEN = re.compile(r'"[^"\n]*"|\d+\.\d*(?:e-?\d+)?|\d+|[%@][\w.]+|[A-Za-z_]\w*|[^\s\w]')
_TYPE = re.compile(r"\b[a-z]+\d*\[([^\[\]\n]*)\]")
_ATTR = re.compile(r"(?<=[{,] )(\w+)=([^,{}\n\[\]]+)")
_CHARS = "".join(map(chr, range(32, 127))) + "\n\t\r\x0c\x00\u00e9\u2028"


def _symbols(text: str) -> list[str]:
    return re.findall(r"^\s*symbol (\w+) in", text, flags=re.M) or ["s0"]


def flip_bytes(text: str, rng: random.Random) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 4)):
        chars[rng.randrange(len(chars))] = rng.choice(_CHARS)
    return "".join(chars)


def duplicate_token(text: str, rng: random.Random) -> str:
    m = rng.choice(list(_TOKEN.finditer(text)))
    glue = rng.choice(["", " ", ", ", " + ", "*", "("])
    return text[:m.start()] + glue.join([m.group()] * rng.randint(2, 24)) + text[m.end():]


def splice_dims(text: str, rng: random.Random) -> str:
    types = list(_TYPE.finditer(text))
    if len(types) < 2:
        return text
    a, b = rng.sample(types, 2)
    dims = b.group(1) if rng.random() < 0.5 else f"{a.group(1)}, {b.group(1)}"
    return text[:a.start(1)] + dims + text[a.end(1):]


def hostile_dim(text: str, rng: random.Random) -> str:
    types = [m for m in _TYPE.finditer(text) if m.group(1)]
    if not types:
        return text
    m = rng.choice(types)
    dims = m.group(1).split(", ")
    dims[rng.randrange(len(dims))] = hostile_expr(rng, _symbols(text))
    return text[:m.start(1)] + ", ".join(dims) + text[m.end(1):]


def hostile_attr(text: str, rng: random.Random) -> str:
    attrs = list(_ATTR.finditer(text))
    if not attrs:
        return hostile_dim(text, rng)
    m = rng.choice(attrs)
    return text[:m.start(2)] + hostile_expr(rng, _symbols(text)) + text[m.end(2):]


def declare_symbols(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    new = [f"  symbol s{i} in [{rng.randint(0, 4)}, {rng.choice(['inf', '8', '512', str(2**62)])}]"
           for i in range(1, rng.randint(2, 9))]
    at = next((i + 1 for i, line in enumerate(lines) if line.startswith("graph ")), 1)
    return "\n".join(lines[:at] + new + lines[at:])


def shuffle_lines(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    action = rng.choice(["duplicate", "delete", "swap"])
    if action == "duplicate":
        lines.insert(j, lines[i])
    elif action == "delete":
        del lines[i]
    else:
        lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


MUTATIONS: dict[str, Callable[[str, random.Random], str]] = {
    "flip_bytes": flip_bytes, "duplicate_token": duplicate_token, "splice_dims": splice_dims,
    "hostile_dim": hostile_dim, "hostile_attr": hostile_attr,
    "declare_symbols": declare_symbols, "shuffle_lines": shuffle_lines,
}


def mutate(text: str, rng: random.Random) -> tuple[str, list[str]]:
    """`text` with 1 to 3 random mutations, and their names. A hostile expression usually
    comes with more symbols declared, so that it gets past the undeclared-symbol check."""
    names = rng.choices(list(MUTATIONS), k=rng.randint(1, 3))
    if any(n.startswith("hostile") for n in names) and rng.random() < 0.7:
        names.insert(0, "declare_symbols")
    for name in names:
        text = MUTATIONS[name](text, rng)
    return text, names


# -- running -------------------------------------------------------------------------------------
@dataclass
class ParseOutcome:
    kind: str
    seconds: float
    detail: str = ""
    calls: int = 0  # Python function calls the parse made (with count=True): work, counted


class _OverTime(BaseException):
    """Raised by the CPU-time alarm; a BaseException so that no `except Exception` eats it."""


def _alarm(*_):
    raise _OverTime


def parse_case(text: str, limit_s: float = 10.0, count: bool = False) -> ParseOutcome:
    """Parse and verify `text` from a cold sympy cache, within `limit_s` seconds of CPU; with
    `count`, under cProfile, counting the Python function calls made (a measure of work that,
    unlike a time, does not vary with the machine's load)."""
    from sympy.core.cache import clear_cache

    clear_cache()
    profile = cProfile.Profile(builtins=False) if count else None
    old = signal.signal(signal.SIGPROF, _alarm)
    signal.setitimer(signal.ITIMER_PROF, limit_s)
    start = time.process_time()
    try:
        if profile is not None:
            profile.enable()
        kind, detail = _parse(text)
    except _OverTime:
        kind, detail = "over-time", f"more than {limit_s} s of CPU"
    finally:
        if profile is not None:
            profile.disable()
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)
    seconds = time.process_time() - start
    calls = sum(e.callcount for e in profile.getstats()) if profile is not None else 0
    return ParseOutcome(kind, seconds, detail, calls)


def _parse(text: str) -> tuple[str, str]:
    from compiler.errors import DayzeroError, IRParseError
    from compiler.ir import parse_ir, verify

    try:
        verify(parse_ir(text, "fuzz.dzir"))
        return "parsed", ""
    except IRParseError as exc:
        return "parse-error", exc.what[:120]
    except DayzeroError as exc:
        return "other-error", f"{type(exc).__name__}: {exc.what[:120]}"
    except Exception as exc:  # noqa: BLE001 - what the fuzz exists to find
        return "raw", f"{type(exc).__name__}: {str(exc)[:200]}"


def per_kb(amount: float, text: str) -> float:
    return amount / max(len(text.encode("utf-8", "surrogatepass")) / 1024, 1e-9)


@dataclass
class IRFuzzReport:
    """Outcomes by kind, and the costliest cases per KB against the unmutated dump's cost."""

    cases: int
    base_s_per_kb: float
    base_calls_per_kb: float = 0.0  # with count=True
    kinds: Counter = field(default_factory=Counter)
    slowest: list = field(default_factory=list)  # the TOP (s/KB, case, info, text), costliest first
    worst_calls_per_kb: float = 0.0
    raw: list = field(default_factory=list)

    TOP = 5

    @property
    def worst_s_per_kb(self) -> float:
        return self.slowest[0][0] if self.slowest else 0.0

    @property
    def ratio(self) -> float:
        return self.worst_s_per_kb / self.base_s_per_kb if self.base_s_per_kb else float("inf")

    def add(self, case: int, names: list[str], outcome: ParseOutcome, text: str) -> None:
        self.kinds[outcome.kind] += 1
        info = {"case": case, "mutations": names, "kind": outcome.kind,
                "seconds": round(outcome.seconds, 4), "kb": round(len(text) / 1024, 1),
                "detail": outcome.detail}
        self._rank((per_kb(outcome.seconds, text), case, info, text))
        self.worst_calls_per_kb = max(self.worst_calls_per_kb, per_kb(outcome.calls, text))
        if outcome.kind in ("raw", "over-time"):
            self.raw.append({"case": case, "mutations": names, "detail": outcome.detail})

    def _rank(self, entry: tuple) -> None:
        kept = [e for e in self.slowest if e[1] != entry[1]]
        self.slowest = sorted([*kept, entry], key=lambda e: -e[0])[:self.TOP]

    def remeasure(self, repeats: int = 3) -> None:
        """Time the slowest cases again, keeping each one's median: one run's time can be a
        moment of load on the machine, not the case's cost."""
        for _, case, info, text in list(self.slowest):
            median = sorted(parse_case(text).seconds for _ in range(repeats))[repeats // 2]
            self._rank((per_kb(median, text), case, dict(info, seconds=round(median, 4)), text))

    def summary(self) -> dict:
        out = {"cases": self.cases, "outcomes": {k: self.kinds.get(k, 0) for k in KINDS},
               "base_ms_per_kb": round(self.base_s_per_kb * 1e3, 3),
               "worst_ms_per_kb": round(self.worst_s_per_kb * 1e3, 3),
               "worst_over_base": round(self.ratio, 2),
               "slowest": [dict(e[2], ms_per_kb=round(e[0] * 1e3, 3)) for e in self.slowest],
               "raw": self.raw[:20]}
        if self.base_calls_per_kb:
            out["worst_calls_over_base"] = round(
                self.worst_calls_per_kb / self.base_calls_per_kb, 2)
        return out


def base_cost(text: str, repeats: int = 5) -> tuple[float, float]:
    """Median parse time per KB of the unmutated text (cold sympy cache each time), and its
    counted calls per KB."""
    times = sorted(parse_case(text).seconds for _ in range(repeats))
    return per_kb(times[len(times) // 2], text), per_kb(parse_case(text, count=True).calls, text)


def run(cases: int, seed: int = 0, base: str | None = None, limit_s: float = 10.0,
        save: Path | None = None, log: Callable[[str], None] | None = None,
        count: bool = False) -> IRFuzzReport:
    """Fuzz `cases` mutants of `base` (the llama dump if None) with RNG seed `seed`; with
    `count`, also count each parse's calls (cProfile: about 3x slower)."""
    base = real_dump() if base is None else base
    seconds, calls = base_cost(base)
    report = IRFuzzReport(cases, seconds, calls if count else 0.0)
    rng = random.Random(seed)
    for i in range(cases):
        text, names = mutate(base, rng)
        outcome = parse_case(text, limit_s, count)
        report.add(i, names, outcome, text)
        if save is not None and outcome.kind in ("raw", "over-time"):
            _save(save, f"case{i}.dzir", text)
        if log is not None and (i + 1) % 250 == 0:
            log(f"{i + 1}/{cases}: {dict(report.kinds)}, worst "
                f"{report.worst_s_per_kb * 1e3:.2f} ms/KB ({report.ratio:.2f}x the dump's)")
    report.remeasure()
    if save is not None:
        for rank, (_, case, _, text) in enumerate(report.slowest):
            _save(save, f"slowest{rank}-case{case}.dzir", text)
    return report


def _save(folder: Path, name: str, text: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text, errors="surrogatepass")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=float, default=10.0, help="CPU seconds per case")
    parser.add_argument("--dump", type=Path, help="a .dzir to mutate (default: llama's IR)")
    parser.add_argument("--write-dump", type=Path, metavar="FILE.dzir",
                        help="only write the real dump (with --layers) to FILE and exit")
    parser.add_argument("--layers", type=int, help="decoder layers of the dump (default: 2)")
    parser.add_argument("--count", action="store_true",
                        help="also count each parse's function calls (about 3x slower)")
    parser.add_argument("--save", type=Path,
                        help="write raw, over-time and the slowest cases' texts here")
    args = parser.parse_args(argv)
    if args.write_dump:
        layers = f"{args.layers} layer(s)" if args.layers else "2 layers"
        args.write_dump.write_text(
            f"# examples/llama.py's decoder with {layers}, as the frontend gives it. Written by\n"
            f"#   python benchmarks/fuzz_ir.py --write-dump {args.write_dump}"
            + (f" --layers {args.layers}" if args.layers else "") + "\n" + real_dump(args.layers))
        return 0
    base = args.dump.read_text() if args.dump else real_dump(args.layers)
    report = run(args.cases, args.seed, base, args.limit, args.save,
                 log=lambda line: print(line, file=sys.stderr, flush=True), count=args.count)
    print(json.dumps(report.summary(), indent=2))
    bad = report.kinds["raw"] + report.kinds["over-time"]
    return 1 if bad or report.ratio > 2 else 0


if __name__ == "__main__":
    sys.exit(main())
