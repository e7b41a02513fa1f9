"""Runs documented steps in order in the current folder, as a new user would type them there.

    python tests/docs_runner.py STEPS.json RESULTS.json

tests/test_docs_commands.py starts it with the python of an environment holding only what the
docs' install brings (tests/docs_env.py), so a step works only if that install makes it work.
Each step is {"kind", "text", "line"}: "shell" one command line (`dayzero` runs in this process
through `compiler.cli.main`, `python` as a subprocess of this interpreter), "python" a block run
with exec, "file" a named YAML block written to the folder. RESULTS.json gets, after each step,
the list of {"line", "text", "status", "output"} so far; the run stops at the first step that
fails.
"""

from __future__ import annotations

import os
import sys

# As `python -c` has it, the working folder comes first on sys.path, not this file's folder:
# tests/ has subfolders named like the packages (tests/compiler, ...), which would shadow the
# installed ones as namespace packages.
sys.path[0] = os.getcwd()

import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402


def run_step(step: dict, where: Path) -> tuple[int, str]:
    """Run one step in `where`; its exit status and what it printed."""
    if step["kind"] == "file":
        name = step["text"].split("\n", 1)[0][2:]
        (where / name).write_text(step["text"])
        return 0, ""
    out = io.StringIO()
    if step["kind"] == "python":
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                exec(compile(step["text"], f"<doc line {step['line']}>", "exec"),
                     {"__name__": "__doc__"})
        except BaseException:  # the block's own failure is the step's result
            return 1, out.getvalue() + traceback.format_exc()
        return 0, out.getvalue()
    argv = shlex.split(step["text"], comments=True)
    if argv[0] == "dayzero":
        from compiler.cli import main

        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                status = main(argv[1:])
            except SystemExit as exit_:  # --help, --version, usage errors
                status = exit_.code if isinstance(exit_.code, int) else 0
        return status, out.getvalue()
    if argv[0] == "python":
        result = subprocess.run([sys.executable, *argv[1:]], cwd=where, capture_output=True,
                                text=True, timeout=300)
        return result.returncode, result.stdout + result.stderr
    return 1, (f"this runner runs `dayzero` and `python` commands, not {argv[0]!r}: "
               f"{step['text']}")


def main(steps_file: str, results_file: str) -> int:
    steps = json.loads(Path(steps_file).read_text())
    results: list[dict] = []
    for step in steps:
        status, output = run_step(step, Path.cwd())
        results.append({"line": step["line"], "text": step["text"], "status": status,
                        "output": output})
        Path(results_file).write_text(json.dumps(results))
        if status != 0:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
