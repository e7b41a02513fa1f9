"""Compile deletes, renames or overwrites only what it created (issue 33, item 1).

Temporary folders carry their owner's marker; the sweep takes only marked folders of its own
purpose whose owner is provably gone; `--force` replaces only a dayzero artifact.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import compiler.writer.artifact_writer as writer
from compiler.cli import main
from compiler.errors import DayzeroError
from compiler.writer import TEMP_PURPOSE, sweep_stale_temps, write_artifact
from runtime.distributed import RUN_DIR_PURPOSE, sweep_run_dirs
from runtime.stale_dirs import (
    MARKER,
    boot_id,
    make_marked_dir,
    mark,
    owner_gone,
    process_start,
    read_marker,
)

ROOT = Path(__file__).resolve().parents[2]
MLP = f"{ROOT}/examples/mlp.py:build"
TWO_HOURS_AGO = time.time() - 7200


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def folder_with_a_file(path: Path, age: float | None = None) -> Path:
    path.mkdir()
    (path / "chapter1.tex").write_text("my thesis")
    if age is not None:
        os.utime(path, (age, age))
    return path


def write_marker(folder: Path, **fields) -> None:
    record = {"marker": 1, "purpose": TEMP_PURPOSE, "pid": os.getpid(),
              "start": process_start(os.getpid()), "host": socket.gethostname(),
              "boot": boot_id(), **fields}
    (folder / MARKER).write_text(json.dumps(record))


def names(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir())


def test_unmarked_folders_named_like_temporaries_survive_a_compile(tmp_path):
    """The issue's report: both folders were deleted by `dayzero compile -o DIR/m.dz`."""
    thesis = folder_with_a_file(tmp_path / ".thesis.12345678.tmp", TWO_HOURS_AGO)
    data = folder_with_a_file(tmp_path / ".data.99999-abcdef12.tmp", TWO_HOURS_AGO)
    dead = folder_with_a_file(tmp_path / f".m.dz.{dead_pid()}-0123abcd.tmp", TWO_HOURS_AGO)
    assert main(["compile", MLP, "-o", str(tmp_path / "m.dz"), "--backend", "reference"]) == 0
    for folder in (thesis, data, dead):
        assert (folder / "chapter1.tex").read_text() == "my thesis"
    assert names(tmp_path) == sorted(["m.dz", thesis.name, data.name, dead.name])
    assert not (tmp_path / "m.dz" / MARKER).exists()  # the artifact carries no marker


def test_a_marked_folder_of_a_dead_writer_is_removed(tmp_path, make_mlp):
    """A real writer process makes its folder and dies; the next write sweeps it."""
    stale = tmp_path / ".a.dz.1-0123abcd.tmp"
    code = ("import sys; from pathlib import Path; from runtime.stale_dirs import "
            "make_marked_dir; d = make_marked_dir(Path(sys.argv[1]), sys.argv[2]); "
            "(d / 'weights').mkdir()")
    subprocess.run([sys.executable, "-c", code, str(stale), TEMP_PURPOSE], cwd=ROOT, check=True)
    assert read_marker(stale)["purpose"] == TEMP_PURPOSE
    write_artifact(tmp_path / "m.dz", make_mlp(), "reference")
    assert names(tmp_path) == ["m.dz"]


def test_a_running_writers_folder_is_kept(tmp_path):
    live = make_marked_dir(tmp_path / ".b.dz.5-0123abcd.tmp", TEMP_PURPOSE)  # this process
    (live / "weights").mkdir()
    assert sweep_stale_temps(tmp_path) == [] and names(live) == sorted([MARKER, "weights"])


@pytest.mark.parametrize("fields, removed", [
    ({"pid": None}, False),  # invalid marker: not ours
    ({"pid": "123"}, False),
    ({"marker": 2}, False),
    ({"purpose": RUN_DIR_PURPOSE, "pid": "dead"}, False),  # a launcher's, not a writer's
    ({"host": "another-host", "pid": "dead"}, False),  # its pids are not ours to judge
    ({"pid": "dead"}, True),
    ({"pid": "dead", "start": None, "boot": None}, True),
    ({"boot": "another-boot"}, True),  # the machine rebooted since: every owner is gone
    # a live pid (this process) with another start time: the pid was reused, the writer that
    # marked the folder is gone. A forged marker cannot be told from that; removing it harms
    # only its forger, who could remove the folder anyway (markers of other users are ignored)
    ({"start": "other"}, True),
    ({"start": None}, False),  # a live pid, start unknown: it may be the writer, kept
    ({}, False),  # this very process
])
def test_only_provably_dead_owners_folders_are_swept(tmp_path, fields, removed):
    folder = folder_with_a_file(tmp_path / ".c.dz.7-89abcdef.tmp")
    if fields.get("pid") == "dead":
        fields["pid"] = dead_pid()
    if fields.get("start") == "other":
        fields["start"] = process_start(os.getpid()) + 1
    if fields.get("boot") == "another-boot" and boot_id() is None:
        pytest.skip("no boot id on this system")
    write_marker(folder, **fields)
    assert sweep_stale_temps(tmp_path) == ([folder] if removed else [])
    assert folder.exists() is not removed


def test_markers_that_are_not_plain_small_files_are_ignored(tmp_path):
    target = tmp_path / "real-marker"
    target.write_text(json.dumps({"marker": 1, "purpose": TEMP_PURPOSE, "pid": dead_pid(),
                                  "start": None, "host": socket.gethostname(), "boot": None}))
    linked = folder_with_a_file(tmp_path / ".d.dz.1-89abcdef.tmp")
    (linked / MARKER).symlink_to(target)
    garbage = folder_with_a_file(tmp_path / ".e.dz.1-89abcdef.tmp")
    (garbage / MARKER).write_text("[" * 100_000)
    huge = folder_with_a_file(tmp_path / ".f.dz.1-89abcdef.tmp")
    write_marker(huge, pid=dead_pid(), padding="x" * 5000)
    misnamed = folder_with_a_file(tmp_path / "g.dz.1-89abcdef.tmp")  # not the writer's name
    write_marker(misnamed, pid=dead_pid())
    assert sweep_stale_temps(tmp_path) == []
    assert all(f.exists() for f in (linked, garbage, huge, misnamed))


def test_owner_gone_reads_a_real_dead_process():
    pid = dead_pid()
    record = {"pid": pid, "start": None, "host": socket.gethostname(), "boot": boot_id()}
    assert owner_gone(record)
    assert not owner_gone({**record, "pid": os.getpid(), "start": process_start(os.getpid())})


def test_launcher_sweep_takes_only_its_own_marked_folders(tmp_path):
    dead = tmp_path / f"dayzero-run-{dead_pid()}-abc123"
    dead.mkdir()
    write_marker(dead, purpose=RUN_DIR_PURPOSE, pid=dead_pid())
    writer_kind = tmp_path / "dayzero-run-1-writer"
    writer_kind.mkdir()
    write_marker(writer_kind, pid=dead_pid())  # the artifact writer's purpose
    unmarked = folder_with_a_file(tmp_path / "dayzero-run-99999-k2j3h4", TWO_HOURS_AGO)
    live = tmp_path / "dayzero-run-2-zz9y8x"
    live.mkdir()
    mark(live, RUN_DIR_PURPOSE)
    assert sweep_run_dirs(tmp_path) == [dead]
    assert names(tmp_path) == sorted([writer_kind.name, unmarked.name, live.name])


def test_the_writers_marker_is_created_first_and_exclusively(tmp_path):
    folder = make_marked_dir(tmp_path / "x", TEMP_PURPOSE)
    assert read_marker(folder)["pid"] == os.getpid()
    with pytest.raises(FileExistsError):
        mark(folder, TEMP_PURPOSE)  # a folder already marked is not claimed again
    with pytest.raises(FileExistsError):
        make_marked_dir(folder, TEMP_PURPOSE)  # nor is an existing folder


# -- --force replaces only a dayzero artifact ----------------------------------------------------

def user_folder(path: Path) -> Path:
    path.mkdir()
    (path / "notes.txt").write_text("keep me")
    return path


def artifact_with(path: Path, extra: str) -> Path:
    """A real artifact, with a user's file put inside it afterwards."""
    assert main(["compile", MLP, "-o", str(path), "--backend", "reference"]) == 0
    target = path / extra
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("keep me")
    return path


@pytest.mark.parametrize("make, kept", [
    (lambda p: user_folder(p), "notes.txt"),
    (lambda p: (p.write_text("keep me"), p)[1], ""),
    (lambda p: (user_folder(p), (p / "manifest.json").write_text('{"format": 1}'), p)[2],
     "notes.txt"),
    (lambda p: (user_folder(p), (p / "manifest.json").write_text("[" * 50_000), p)[2],
     "notes.txt"),
    (lambda p: artifact_with(p, "notes.txt"), "notes.txt"),
    (lambda p: artifact_with(p, ".git/HEAD"), ".git/HEAD"),
    (lambda p: artifact_with(p, "weights/mine.safetensors"), "weights/mine.safetensors"),
])
def test_force_refuses_what_is_not_a_dayzero_artifact(tmp_path, capsys, make, kept):
    out = make(tmp_path / "m.dz")
    before = names(tmp_path)
    assert main(["compile", MLP, "-o", str(out), "--backend", "reference", "--force"]) == 1
    err = capsys.readouterr().err
    assert f"refusing to replace {out}" in err and "Traceback" not in err
    assert ((out / kept) if kept else out).read_text() == "keep me"
    assert names(tmp_path) == before  # no temporary or old folder left behind


def test_force_refuses_a_link_to_a_folder(tmp_path, make_mlp):
    real = user_folder(tmp_path / "real")
    (tmp_path / "m.dz").symlink_to(real)
    with pytest.raises(DayzeroError, match="symbolic link"):
        write_artifact(tmp_path / "m.dz", make_mlp(), "reference", force=True)
    assert (real / "notes.txt").read_text() == "keep me"


def test_force_replaces_an_artifact_and_a_failed_rename_puts_the_old_one_back(
        tmp_path, make_mlp, monkeypatch):
    out = write_artifact(tmp_path / "m.dz", make_mlp(0), "reference")
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    rename = os.rename

    def failing(source, dest):
        if Path(source).name.endswith(".tmp") and Path(dest) == out:
            raise OSError(28, "No space left on device")
        rename(source, dest)

    monkeypatch.setattr(writer.os, "rename", failing)
    with pytest.raises(DayzeroError, match="No space left on device"):
        write_artifact(out, make_mlp(1), "reference", force=True)
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert names(tmp_path) == ["m.dz"]  # the old artifact back in place, nothing else left
    monkeypatch.setattr(writer.os, "rename", rename)
    write_artifact(out, make_mlp(1), "reference", force=True)
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} != before
    assert names(tmp_path) == ["m.dz"]


def test_an_artifact_with_its_own_empty_folders_may_be_replaced(tmp_path, make_mlp):
    """A model without weights leaves weights/ empty: the artifact is still its own."""
    out = write_artifact(tmp_path / "m.dz", make_mlp(0), "reference")
    for folder in ("weights", "tokenizer"):
        (out / folder).mkdir(exist_ok=True)
        for file in (out / folder).iterdir():
            file.unlink()
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"] = {k: v for k, v in manifest["files"].items()
                         if not k.startswith("weights/")}
    (out / "manifest.json").write_text(json.dumps(manifest))
    write_artifact(out, make_mlp(1), "reference", force=True)
    assert (out / "manifest.json").is_file()
    (out / "mine").mkdir()  # an empty folder a compile never makes is the user's
    with pytest.raises(DayzeroError, match="it holds mine/"):
        write_artifact(out, make_mlp(1), "reference", force=True)


def test_an_empty_folder_may_be_replaced(tmp_path, make_mlp):
    (tmp_path / "m.dz").mkdir()
    write_artifact(tmp_path / "m.dz", make_mlp(), "reference", force=True)
    assert (tmp_path / "m.dz" / "manifest.json").is_file()


@pytest.mark.parametrize("extra, message", [
    ({"manifest.json": b"{}"}, "may not be named manifest.json"),
    ({MARKER: b"{}"}, f"may not be named {MARKER}"),
    ({"graph.dzir": b"x"}, "two files of the artifact would be written at graph.dzir"),
    ({"weights/x.bin": b"x"}, "weights folder weights/ already holds other files"),
])
def test_extra_files_never_overwrite_the_writers_own(tmp_path, make_mlp, extra, message):
    with pytest.raises(DayzeroError, match=message):
        write_artifact(tmp_path / "m.dz", make_mlp(), "reference", extra_files=extra)
    assert names(tmp_path) == []
