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

# docs whose commands all run here, and the commands left out, with why
DOCS = ["docs/performance.md", "docs/parallel.md"]
LEFT_OUT = {
    "dayzero run llama_tp2pp2.dz --nproc 4":
        "four rank processes on two cores take about a minute; tests/runtime/test_distributed.py "
        "runs the same tp=2 x pp=2 layout of this model on four ranks",
}
# Not run: docs/adapting-a-new-model.md (coverage/align of six models, llava and triton among
# them: minutes), docs/backends.md (SPEC placeholders), docs/ops.md and the benchmark commands
# of docs/performance.md (developer tools, long).
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


@dataclass
class Step:
    kind: str  # "shell" (one command line), "python" (a block) or "file" (a named yaml block)
    text: str
    line: int  # where it is in the file, for the failure message


def doc_steps(text: str, section: str | None = None,
              shells: tuple[str, ...] = ("console", "bash", "sh", "shell")) -> list[Step]:
    """The commands (`$ ` lines of console/bash blocks, `\\` continuations joined) and the
    python blocks of a Markdown text, in order; with `section`, of that `## ` section only;
    `shells` are the block languages read for commands ("" for plain blocks)."""
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
        elif lang == "yaml" and re.match(r"# [\w.-]+\.ya?ml\n", body):
            steps.append(Step("file", body, first))  # "# parallel.yaml": a file the text uses
        elif lang in shells:
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
    if step.kind == "file":
        name = step.text.split("\n", 1)[0][2:]
        (where / name).write_text(step.text)
        return 0, ""
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
    monkeypatch.setenv("DAYZERO_CACHE_DIR", str(tmp_path / "cache"))  # torch.compile's cache
    yield tmp_path
    import torch

    torch._dynamo.reset()


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


@pytest.mark.slow  # a tiny-Llama compile per doc, an inspect or two: ~10 s each on 2 cores
@pytest.mark.parametrize("doc", DOCS)
def test_doc_commands_run_in_order(doc, fresh_folder):
    steps = doc_steps((ROOT / doc).read_text())
    assert any(s.kind == "shell" for s in steps)
    for step in steps:
        if step.text in LEFT_OUT:
            continue
        status, output = run_step(step, fresh_folder)
        assert status == 0, f"{doc}:{step.line}: `{step.text}` exited {status}:\n{output}"


def test_every_documented_dayzero_command_parses():
    """Cheap check of the commands no test runs: each `$ dayzero ...` line of README.md and
    docs/*.md is accepted by the argument parser and names SPEC files that exist."""
    from compiler.cli import build_parser

    checked = 0
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for step in doc_steps(doc.read_text(), shells=("console", "bash", "")):
            argv = shlex.split(step.text, comments=True) if step.kind == "shell" else []
            if argv[:1] != ["dayzero"] or "--help" in argv or "--version" in argv:
                continue
            try:
                args = build_parser().parse_args(argv[1:])
            except SystemExit:
                raise AssertionError(f"{doc.name}:{step.line}: `{step.text}` does not "
                                     "parse") from None
            spec = getattr(args, "spec", None) or ""
            if ".py:" in spec:
                assert (ROOT / spec.split(":")[0]).is_file(), f"{doc.name}:{step.line}: {spec}"
            checked += 1
    assert checked >= 20
