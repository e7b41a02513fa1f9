"""The commands the README's tour shows run, in order, as a new user would type them.

Fenced ```console / ```bash blocks hold commands as `$ ` lines (the other lines are sample
output); ```python blocks are run as they are. Everything runs in a fresh folder holding a link
to examples/, as if typed at the repository's root: `dayzero` in-process through
`compiler.cli.main`, `python` as a subprocess of this interpreter.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from compiler.cli import main

ROOT = Path(__file__).resolve().parents[1]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


@dataclass
class Step:
    kind: str  # "shell" (one command line) or "python" (a block)
    text: str
    line: int  # where it is in the file, for the failure message


def doc_steps(text: str, section: str | None = None) -> list[Step]:
    """The commands (`$ ` lines of console/bash blocks, `\\` continuations joined) and the
    python blocks of a Markdown text, in order; with `section`, of that `## ` section only."""
    lines_before = 0
    if section is not None:
        offset = text.index(f"\n## {section}\n")
        end = text.find("\n## ", offset + 1)
        lines_before = text.count("\n", 0, offset)
        text = text[offset:end if end >= 0 else len(text)]
    steps = []
    for match in _FENCE.finditer(text):
        lang, body = match.group(1), match.group(2)
        first = lines_before + text.count("\n", 0, match.start()) + 1
        if lang == "python":
            steps.append(Step("python", body, first))
        elif lang in ("console", "bash", "sh", "shell"):
            lines = body.splitlines()
            i = 0
            while i < len(lines):
                if lines[i].startswith("$ "):
                    command, number = lines[i][2:], first + 1 + i
                    while command.endswith("\\") and i + 1 < len(lines):
                        i += 1
                        command = command[:-1] + " " + lines[i].strip()
                    steps.append(Step("shell", command, number))
                i += 1
    return steps


def main_job(text: str) -> list[Step]:
    """The `dayzero` commands of the README's first command line ("Two commands"): the tour
    comes after them, so it has to work on what they leave behind (llama.dz)."""
    start = text.index("\n## Two commands\n")
    match = _FENCE.search(text, start)
    return [Step("shell", part.strip(), text.count("\n", 0, match.start()) + 2)
            for part in match.group(2).split("&&") if part.strip().startswith("dayzero ")]


def run_step(step: Step, where: Path) -> tuple[int, str]:
    """Run one step in `where`; its exit status and what it printed."""
    if step.kind == "python":
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(step.text, f"README.md:{step.line}", "exec"), {"__name__": "__doc__"})
        return 0, out.getvalue()
    argv = shlex.split(step.text, comments=True)
    if argv[0] == "dayzero":
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(argv[1:])
            except SystemExit as exit_:  # --help, --version
                status = exit_.code or 0
        return status, out.getvalue() + err.getvalue()
    if argv[0] == "python":
        result = subprocess.run([sys.executable, *argv[1:]], cwd=where, capture_output=True,
                                text=True, timeout=120)
        return result.returncode, result.stdout + result.stderr
    raise AssertionError(f"line {step.line}: this test runs `dayzero` and `python` commands, "
                         f"not {argv[0]!r}: {step.text}")


@pytest.fixture
def fresh_folder(tmp_path, monkeypatch):
    """An empty folder that looks like the repository's root to the docs' commands."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_parser_finds_commands_continuations_and_python():
    text = ("intro\n```console\n$ dayzero a\noutput\n$ dayzero b \\\n    --c d\n```\n"
            "```\n$ not a console block\n```\n```python\nx = 1\n```\n")
    steps = doc_steps(text)
    assert [(s.kind, s.text, s.line) for s in steps] == [
        ("shell", "dayzero a", 3), ("shell", "dayzero b  --c d", 5), ("python", "x = 1\n", 11)]


@pytest.mark.slow  # three compiles of the tiny Llama, a few runs: ~30 s on 2 cores
def test_readme_tour_runs_in_order(fresh_folder):
    readme = (ROOT / "README.md").read_text()
    first = main_job(readme)
    assert [s.text.split()[:2] for s in first] == [["dayzero", "compile"], ["dayzero", "run"]]
    steps = doc_steps(readme, section="A five-minute tour")
    assert sum(s.kind == "shell" for s in steps) >= 8 and any(s.kind == "python" for s in steps)
    printed = {}
    for step in first + steps:
        status, output = run_step(step, fresh_folder)
        assert status == 0, f"README.md:{step.line}: `{step.text}` exited {status}:\n{output}"
        printed[step.text] = output
    # what the tour's prose says of these commands
    ir_files = sorted(p.name for p in (fresh_folder / "ir").glob("*.dzir"))
    assert "02-fold_constants.dzir" in ir_files
    assert "# lowering by onnxruntime:" in printed["dayzero inspect llama.dz"]
    verdict = [text for command, text in printed.items() if "--check" in command]
    assert verdict and "matches PyTorch eager within" in verdict[0]
    assert (fresh_folder / "out.npz").is_file() and (fresh_folder / "arena.png").is_file()
    assert (fresh_folder / "llama_ref.dz" / "manifest.json").is_file()
