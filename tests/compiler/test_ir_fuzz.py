"""Fuzzing parse_ir with mutations of real .dzir texts (every op's graph from test_ir_text,
printed): each case ends, within a few seconds, in a graph the verifier accepts or in an
IRParseError whose `where` names a line and column of the text (issue 16)."""

from __future__ import annotations

import functools
import re
import signal
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler.errors import IRParseError
from compiler.ir import OPS, parse_ir, print_ir, verify
from tests.compiler.test_ir_text import op_graph

SECONDS = 5  # per case; a parse of these texts takes milliseconds

# Fragments that broke the parser once (issue 16), and the grammar's own punctuation.
FRAGMENTS = [
    "9**(9**9)", "2**-1", "2**64", "(s0 + 1)**64", "((s0**8)**8)**8", "9" * 60, "-" * 200,
    "(" * 200, ")" * 200, "[" * 300, "]", "{", "}", "f32", "s0", "s9", "Max()", "Mod(s0, 0)",
    "floor(s0, 2)", "1/0", "s0/2", "-1", "true", "none", "_", "%x", "@w", "%\"\x07\"",
    '"\x07"', '"\\q"', "\x0c", "\x0b", "\r", "\n", "\u2028", "#", ",", "=", ":", "**", "+",
    "loc(\"a\")", "return", "return %x", "symbol s0 in [5, 2]", "symbol s1 in [0, inf]",
    "{shape=true}", "{step=0}", "{dims=[[[[1]]]]}", "{dtype=s0}", "1e999", "-nan",
]


# Replacements for one token of the same kind, so mutants get past the grammar into the checks.
_TOKEN = re.compile(r'"[^"\n]*"|\d+\.\d*(?:e-?\d+)?|\d+|(?<![%@\w])[A-Za-z_]\w*')
_KEYWORDS = {"graph", "symbol", "in", "input", "weight", "return", "loc", "inf"}
SAME_KIND = {
    "int": ["0", "1", "3", "-1", "64", "9" * 25, "2**63", "s0", "s0/2", "(s0 - 100)", "2**-1",
            "Max(s0, 2)", "Mod(s0, 0)", "floor(s0/0)", "(s0 + 1)**8", "s1", "f32"],
    "name": ["s0", "s1", "f32", "i64", "bool", "u8", "true", "none", "I", "zoo", "nan", "Max",
             "floor", "neg", "linear", "reshape", "shape", "dim", "step", "dtype"],
    "string": ['"\\u0000"', '"\\ud800"', '"\x07"', '""', '"\\q"'],
    "float": ["1e999", "0.0", "nan", "-inf", "1.5"],
}


def _kind(token: str) -> str:
    if token[0] == '"':
        return "string"
    if token[0].isdigit():
        return "float" if "." in token else "int"
    return "name"


@functools.cache
def corpus() -> list[str]:
    return [print_ir(op_graph(op)) for op in sorted(OPS)]


def _alarm(*_):
    raise TimeoutError(f"parse_ir took more than {SECONDS} s")


def check(text: str) -> None:
    """parse_ir(text) ends in a verified graph or an IRParseError at a real position."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(SECONDS)
    try:
        try:
            graph = parse_ir(text, "fuzz.dzir")
        except IRParseError as err:
            match = re.fullmatch(r"fuzz\.dzir: line (\d+), column (\d+)", err.where or "")
            assert match, f"no line and column in {err.where!r}"
            line = int(match.group(1))
            assert 1 <= line <= text.count("\n") + 1, err.message()
            return
        verify(graph)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@st.composite
def mutated(draw) -> str:
    text = draw(st.sampled_from(corpus()))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 12)))
        kind = draw(st.sampled_from(["token", "token", "token", "fragment", "delete", "chars",
                                     "line"]))
        tokens = [m for m in _TOKEN.finditer(text) if m.group() not in _KEYWORDS]
        if kind == "token" and tokens:
            m = draw(st.sampled_from(tokens))
            i, j = m.start(), m.end()
            piece = draw(st.sampled_from(SAME_KIND[_kind(m.group())]))
        elif kind == "fragment":
            piece = draw(st.sampled_from(FRAGMENTS))
        elif kind == "chars":
            piece = draw(st.text(max_size=6))
        elif kind == "line":
            lines = text.split("\n")
            piece = draw(st.sampled_from(lines)) + "\n"
            j = i
        else:
            piece = ""
        text = text[:i] + piece + text[j:]
    return text


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(mutated())
def test_mutated_texts_end_in_a_graph_or_a_parse_error(text):
    check(text)


@pytest.mark.parametrize("op", ["linear", "reshape", "slice", "conv", "full", "arange"])
def test_corpus_texts_parse_and_verify(op):
    text = print_ir(op_graph(op))
    check(text)
    assert print_ir(parse_ir(text)) == text


HANGS = {
    # a dim that never finished before (sympy computed 9**387420489)
    "power tower": "graph t {\n  input %x: f32[9**(9**9)]\n  return %x\n}\n",
    # 161 characters of dim that took 22 s and 1.7 GB
    "expanding power": "graph t {\n" + "".join(f"  symbol s{i} in [1, 8]\n" for i in range(8))
    + "  input %x: f32[(s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7)**8]\n"
    "  %y: f32[4] = neg(%x)\n  return %y\n}\n",
}


@pytest.mark.parametrize("name", sorted(HANGS))
def test_cases_that_hung_end_quickly_in_a_subprocess(name):
    """In a subprocess: a hang inside sympy or a C bigint cannot be interrupted by an alarm."""
    code = ("import sys\nfrom compiler.ir import parse_ir\nfrom compiler.errors import "
            "IRParseError\ntry:\n    parse_ir(sys.stdin.read(), 'h.dzir')\nexcept IRParseError "
            "as e:\n    print(e.where)\n")
    done = subprocess.run([sys.executable, "-c", code], input=HANGS[name], text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("h.dzir: line "), done.stdout
