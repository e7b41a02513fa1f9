"""The commands the README's tour and the docs show run, in order, as a new user would type them,
after the install the README gives for them and with nothing more.

Fenced ```console / ```bash blocks hold commands as `$ ` lines (the other lines are sample
output); ```python blocks are run as they are. A `$ pip install -e ".[extra]"` line installs
that extra for the steps after it. Everything runs in a fresh folder holding a link to
examples/, as if typed at the repository's root, by tests/docs_runner.py started with the
python of an environment holding exactly the README's install (tests/docs_env.py): the main
command's `pip install -e ".[...]"` and what the doc installs on the way. The samples the README
shows (a `.dzir` line, command output) are compared with what the commands printed.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from tests.docs_env import InstallEnv, install_extras

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
# of docs/performance.md (developer tools, long), docs/generation.md and docs/serving.md
# (checkpoint placeholders; tests/generation and tests/serving run the same commands).
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


@dataclass
class Step:
    # "shell" (one command line), "python" (a block), "file" (a named yaml block) or
    # "install" (`pip install -e ".[extras]"`: text the extras, comma-separated)
    kind: str
    text: str
    line: int  # where it is in the file, for the failure message


def doc_steps(text: str, section: str | None = None,
              shells: tuple[str, ...] = ("console", "bash", "sh", "shell")) -> list[Step]:
    """The commands (`$ ` lines of console/bash blocks, `\\` continuations joined) and the
    python blocks of a Markdown text, in order; with `section`, of that `## ` section only;
    `shells` are the block languages read for commands ("" for plain blocks)."""
    text, lines_before = _section(text, section)
    steps = []
    for match in _FENCE.finditer(text):
        lang, body = match.group(1), match.group(2)
        first = lines_before + text.count("\n", 0, match.start()) + 1
        if lang == "python":
            steps.append(Step("python", body, first))
        elif lang == "yaml" and re.match(r"# [\w.-]+\.ya?ml\n", body):
            steps.append(Step("file", body, first))  # "# parallel.yaml": a file the text uses
        elif lang in shells:
            steps += [_shell_step(command, first + 1 + i) for i, _, command in _commands(body)]
    return steps


def _section(text: str, section: str | None) -> tuple[str, int]:
    """The text of one `## ` section (all of it without one) and the lines before it."""
    if section is None:
        return text, 0
    offset = text.index(f"\n## {section}\n")
    end = text.find("\n## ", offset + 1)
    return text[offset:end if end >= 0 else len(text)], text.count("\n", 0, offset)


def _commands(body: str) -> list[tuple[int, int, str]]:
    """(index of its first line, of its last, command) of each `$ ` line of a block,
    `\\` continuations joined."""
    lines, found, i = body.splitlines(), [], 0
    while i < len(lines):
        if lines[i].startswith("$ "):
            command, start = lines[i][2:], i
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
            found.append((start, i, command))
        i += 1
    return found


def _shell_step(command: str, line: int) -> Step:
    extras = install_extras(command)
    if extras is not None and command.strip().startswith("pip install"):
        return Step("install", ",".join(sorted(extras)), line)
    return Step("shell", command, line)


def main_job(text: str) -> list[Step]:
    """The `dayzero` commands of the README's first command line ("Two commands"): the tour
    comes after them, so it has to work on what they leave behind (llama.dz)."""
    start = text.index("\n## Two commands\n")
    match = _FENCE.search(text, start)
    return [Step("shell", part.strip(), text.count("\n", 0, match.start()) + 2)
            for part in match.group(2).split("&&") if part.strip().startswith("dayzero ")]


def main_install(text: str) -> set[str]:
    """The extras the README's first command installs dayzero with."""
    start = text.index("\n## Two commands\n")
    extras = install_extras(_FENCE.search(text, start).group(2))
    assert extras is not None, "the README's first command installs no dayzero"
    return extras


def run_documented(steps: list[Step], extras: set[str], tmp_path: Path) -> dict[str, dict]:
    """Run `steps` in order in a fresh folder, in an environment holding `pip install -e
    ".[extras]"` (and what the steps' own `pip install` lines add); assert each exits 0.
    Returns each command's result (status, output) by its text."""
    where = tmp_path / "work"
    where.mkdir()
    (where / "examples").symlink_to(ROOT / "examples")
    env = InstallEnv(tmp_path / "venv", extras)
    results: dict[str, dict] = {}
    batch: list[Step] = []
    for step in [*steps, None]:
        if step is not None and step.kind != "install":
            batch.append(step)
            continue
        if batch:
            for result in _run_batch(batch, env, where, tmp_path):
                assert result["status"] == 0, (
                    f"line {result['line']}: `{result['text']}` exited {result['status']} "
                    f"after `pip install -e \".[{','.join(sorted(env.extras))}]\"`:\n"
                    f"{result['output']}")
                results[result["text"]] = result
            batch = []
        if step is not None:
            env.add(set(filter(None, step.text.split(","))))
    return results


def _run_batch(steps: list[Step], env: InstallEnv, where: Path, tmp_path: Path) -> list[dict]:
    files = tmp_path / "steps.json", tmp_path / "results.json"
    files[0].write_text(json.dumps([asdict(s) for s in steps]))
    files[1].write_text("[]")
    run_env = dict(env.env(), DAYZERO_CACHE_DIR=str(tmp_path / "cache"))  # torch.compile's
    process = subprocess.run([str(env.python), str(ROOT / "tests" / "docs_runner.py"),
                              *map(str, files)], cwd=where, env=run_env, capture_output=True,
                             text=True, timeout=1200)
    results = json.loads(files[1].read_text())
    if process.returncode != 0 and (not results or results[-1]["status"] == 0):
        raise AssertionError(f"the docs runner failed:\n{process.stdout}{process.stderr}")
    return results


def test_parser_finds_commands_continuations_and_python():
    text = ("intro\n```console\n$ dayzero a\noutput\n$ dayzero b \\\n    --c d\n```\n"
            "```\n$ not a console block\n```\n```python\nx = 1\n```\n"
            "```console\n$ pip install -e \".[plot,serve]\"\n$ pip install -e .\n```\n")
    steps = doc_steps(text)
    assert [(s.kind, s.text, s.line) for s in steps] == [
        ("shell", "dayzero a", 3), ("shell", "dayzero b  --c d", 5), ("python", "x = 1\n", 11),
        ("install", "plot,serve", 15), ("install", "", 16)]


def test_the_environment_holds_the_install_and_nothing_else(tmp_path):
    """What the docs' commands run in: `.[hf]` imports transformers but not matplotlib (whose
    metadata is gone too), until the `plot` extra is installed into it."""
    env = InstallEnv(tmp_path / "venv", {"hf"})
    probe = ("import importlib.metadata as m, transformers, compiler\n"
             "try:\n    import matplotlib\n    print('matplotlib', m.version('matplotlib'))\n"
             "except ImportError:\n    print('no matplotlib')\n")

    def run() -> str:
        result = subprocess.run([str(env.python), "-c", probe], cwd=tmp_path, env=env.env(),
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert "matplotlib" in env.blocked() and "transformers" not in env.blocked()
    assert run() == "no matplotlib"
    env.add({"plot"})
    assert run().startswith("matplotlib ")


@pytest.mark.slow  # three compiles of the tiny Llama, a few runs: ~35 s on 2 cores
def test_readme_tour_runs_in_order(tmp_path):
    readme = (ROOT / "README.md").read_text()
    first = main_job(readme)
    assert [s.text.split()[:2] for s in first] == [["dayzero", "compile"], ["dayzero", "run"]]
    steps = doc_steps(readme, section="A five-minute tour")
    assert sum(s.kind == "shell" for s in steps) >= 8 and any(s.kind == "python" for s in steps)
    printed = {text: r["output"] for text, r in
               run_documented(first + steps, main_install(readme), tmp_path).items()}
    folder = tmp_path / "work"
    # what the tour's prose says of these commands
    ir_files = sorted(p.name for p in (folder / "ir").glob("*.dzir"))
    assert "02-fold_constants.dzir" in ir_files
    assert "# lowering by onnxruntime:" in printed["dayzero inspect llama.dz"]
    verdict = [text for command, text in printed.items() if "--check" in command]
    assert verdict and "matches PyTorch eager within" in verdict[0]
    assert (folder / "out.npz").is_file() and (folder / "arena.png").is_file()
    assert (folder / "llama_ref.dz" / "manifest.json").is_file()
    # no pattern matched the tiny Llama partly without firing: the report names none
    report = next(text for command, text in printed.items() if "--report" in command)
    assert "patterns tried that did not fire (why" not in report
    assert "(--report=all lists them)" in report
    # the samples the README shows are what these commands print and write
    _check_ir_samples(readme, folder)
    _check_output_samples(readme, printed)


def _check_ir_samples(readme: str, folder: Path) -> None:
    """Each plain block of the tour whose lines are IR ops is made of lines of the dump file
    the text before it names (`ir/NN-name.dzir`)."""
    tour, _ = _section(readme, "A five-minute tour")
    checked = 0
    for match in _FENCE.finditer(tour):
        lines = match.group(2).splitlines()
        if match.group(1) or not lines or not all(line.startswith("  %") for line in lines):
            continue
        named = re.findall(r"`(ir/\d\d-\w+\.dzir)`", tour[:match.start()])
        assert named, f"the IR sample {lines[0][:40]}... names no dump file before it"
        dumped = (folder / named[-1]).read_text().splitlines()
        for line in lines:
            assert line in dumped, f"README's IR sample is not a line of {named[-1]}: {line}"
        checked += 1
    assert checked >= 1


_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?(?:e[-+]?[0-9]+)?")


def _check_output_samples(readme: str, printed: dict[str, str]) -> None:
    """The output lines a console block shows under a command are lines that command printed,
    in order; numbers may differ (timings, the last digits of a mean)."""
    tour, _ = _section(readme, "A five-minute tour")
    checked = 0
    for match in _FENCE.finditer(tour):
        if match.group(1) != "console":
            continue
        lines = match.group(2).splitlines()
        commands = _commands(match.group(2))
        for n, (_, last, command) in enumerate(commands):
            stop = commands[n + 1][0] if n + 1 < len(commands) else len(lines)
            output = iter(printed[command].splitlines())
            for line in lines[last + 1:stop]:
                pattern = re.compile(_NUMBER.pattern.join(map(re.escape, _NUMBER.split(line))))
                assert any(pattern.fullmatch(out) for out in output), (
                    f"README shows `{line}` under `{command}`, which does not print it "
                    f"(there, in this order):\n{printed[command]}")
                checked += 1
    assert checked >= 8


def test_readme_serving_example_waits_for_health():
    """`dayzero serve ... &` returns at once and the model loads for a while (503 until then):
    the example polls /health on the same address before its first request."""
    readme = (ROOT / "README.md").read_text()
    block = next(m.group(2) for m in _FENCE.finditer(readme) if "$ dayzero serve" in m.group(2))
    commands = [command for _, _, command in _commands(block)]
    serve = next(i for i, c in enumerate(commands) if c.startswith("dayzero serve"))
    port = shlex.split(commands[serve])[shlex.split(commands[serve]).index("--port") + 1]
    assert commands[serve].endswith("&")
    request = next(i for i, c in enumerate(commands) if "/v1/" in c)
    waits = [c for c in commands[serve + 1:request]
             if re.fullmatch(rf"until curl -sf 127\.0\.0\.1:{port}/health; do sleep 1; done"
                             r"(\s+#.*)?", c)]
    assert waits, f"nothing waits for /health between `{commands[serve]}` and the request"
    assert re.search(rf"127\.0\.0\.1:{port}/v1/", commands[request])
    installs = [install_extras(c) for c in commands[:serve]]
    assert {"serve"} in installs, "the serving example installs the serve extra first"


@pytest.mark.slow  # a tiny-Llama compile per doc, an inspect or two: ~10 s each on 2 cores
@pytest.mark.parametrize("doc", DOCS)
def test_doc_commands_run_in_order(doc, tmp_path):
    steps = [s for s in doc_steps((ROOT / doc).read_text()) if s.text not in LEFT_OUT]
    assert any(s.kind == "shell" for s in steps)
    run_documented(steps, main_install((ROOT / "README.md").read_text()), tmp_path)


def test_every_documented_dayzero_command_parses():
    """Cheap check of the commands no test runs: each `$ dayzero ...` line of README.md and
    docs/*.md is accepted by the argument parser and names SPEC files that exist."""
    from compiler.cli import build_parser

    checked = 0
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for step in doc_steps(doc.read_text(), shells=("console", "bash", "text", "")):
            argv = shlex.split(step.text, comments=True) if step.kind == "shell" else []
            if argv[:1] != ["dayzero"] or "--help" in argv or "--version" in argv:
                continue
            try:
                args = build_parser().parse_args([a for a in argv[1:] if a != "&"])
            except SystemExit:
                raise AssertionError(f"{doc.name}:{step.line}: `{step.text}` does not "
                                     "parse") from None
            spec = getattr(args, "spec", None) or ""
            if ".py:" in spec:
                assert (ROOT / spec.split(":")[0]).is_file(), f"{doc.name}:{step.line}: {spec}"
            checked += 1
    assert checked >= 20
