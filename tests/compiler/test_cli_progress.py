"""Progress where time goes: stage lines always, an elapsed-time bar on a terminal, nothing with
--quiet."""

from __future__ import annotations

import io
import time

from compiler.cli import main
from compiler.log import StageLog
from tests.compiler.conftest import MLP


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_sees_the_elapsed_time_of_a_long_stage():
    stream = Terminal()
    log = StageLog(stream)
    with log.stage("export", "model"):
        time.sleep(1.2)
    out = stream.getvalue()
    assert out.startswith("[export] model ...\n")
    assert "\r[export] 00:01" in out  # the bar, redrawn in place while the stage runs
    assert out.rstrip().splitlines()[-1].startswith("[export] done in 1.")


def test_a_log_file_gets_stage_lines_without_bars():
    stream = io.StringIO()
    with StageLog(stream).stage("lower+write"):
        time.sleep(0.6)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "[lower+write] ..." and lines[1].startswith("[lower+write] done in 0.")
    assert "\r" not in stream.getvalue() and len(lines) == 2


def test_quiet_compile_prints_only_the_artifact_path(tmp_path, capsys):
    out = tmp_path / "m.dz"
    assert main(["compile", MLP, "-o", str(out), "--backend", "reference", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out.strip() == str(out)
    assert main(["compile", MLP, "-o", str(out), "--backend", "reference", "--force"]) == 0
    assert "[export]" in capsys.readouterr().err
