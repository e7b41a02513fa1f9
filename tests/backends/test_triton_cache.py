"""The Triton kernel cache (backends/triton/executable.py): a per-user folder created 0700,
refused when it is not ours or others may write to it, files written atomically, and the module
run from the verified source in memory, never from what the file holds afterwards."""

from __future__ import annotations

import inspect
import os
import stat

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (no CUDA here)

import pytest  # noqa: E402

from backends.triton import executable  # noqa: E402
from backends.triton.executable import cache_dir, import_kernels  # noqa: E402
from compiler.errors import DayzeroError  # noqa: E402

SOURCE = "VALUE = 1\n\n\ndef answer():\n    return VALUE\n"
EVIL = "VALUE = 666\n\n\ndef answer():\n    return VALUE\n"


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.delenv("DAYZERO_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path


def test_default_is_the_xdg_cache_created_0700(env):
    folder = cache_dir()
    assert folder == env / "xdg" / "dayzero" / "triton"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    module = import_kernels(SOURCE)
    assert module.answer() == 1
    assert [p.parent for p in folder.iterdir()] == [folder]  # no temp file left behind
    assert not str(module.__file__).startswith("/tmp/dayzero_triton")


def test_env_var_and_option_override(env, monkeypatch):
    monkeypatch.setenv("DAYZERO_CACHE_DIR", str(env / "mine"))
    assert cache_dir() == env / "mine" / "triton"
    assert cache_dir(env / "opt") == env / "opt"
    module = import_kernels(SOURCE, env / "opt")
    assert os.path.dirname(module.__file__) == str(env / "opt")


def test_refuses_a_folder_others_can_write(env):
    folder = env / "shared"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(DayzeroError, match="writable by others"):
        import_kernels(SOURCE, folder)
    folder.chmod(0o770)
    with pytest.raises(DayzeroError, match="writable by others"):
        cache_dir(folder)


def test_refuses_a_folder_of_another_user(env, monkeypatch):
    folder = env / "theirs"
    folder.mkdir(mode=0o700)
    uid = os.getuid()
    monkeypatch.setattr(executable.os, "getuid", lambda: uid + 1)
    with pytest.raises(DayzeroError, match="belongs to user id"):
        import_kernels(SOURCE, folder)


def test_refuses_a_file_where_the_folder_should_be(env):
    (env / "file").write_text("x")
    with pytest.raises(DayzeroError):
        cache_dir(env / "file")


def test_a_stale_or_planted_file_is_replaced(env):
    folder = cache_dir()
    digest = executable.sha256(SOURCE)
    (folder / f"k_{digest}.py").write_text(EVIL)
    assert import_kernels(SOURCE).answer() == 1
    assert (folder / f"k_{digest}.py").read_text() == SOURCE


def test_runs_the_verified_text_even_if_the_file_is_swapped(env, monkeypatch):
    """A file swapped right after it is written (the race of the shared /tmp folder) changes
    nothing: the module and the source inspect (hence Triton's jit) sees are the verified text."""
    real_replace = os.replace

    def replace_then_swap(src, dst, *args, **kwargs):
        real_replace(src, dst, *args, **kwargs)
        with open(dst, "w") as f:
            f.write(EVIL)

    monkeypatch.setattr(os, "replace", replace_then_swap)
    module = import_kernels(SOURCE)
    assert module.answer() == 1
    assert "VALUE" in inspect.getsource(module.answer)
    assert inspect.getsource(module) == SOURCE


@pytest.mark.parametrize("plan", [
    {"buffers": 1}, {"buffers": [1]}, {"buffers": [{"value": "a"}]},
    {"buffers": [{"value": "a", "offset": "x", "size": 4}], "arena_bytes": 8},
    {"buffers": [{"value": "a", "offset": 6, "size": 4}], "arena_bytes": 8},
    {"buffers": [], "arena_bytes": [1]}, [1],
])
def test_a_malformed_memory_plan_is_an_artifact_error(plan):
    from types import SimpleNamespace

    from backends.triton import _memory_slots
    from compiler.errors import ArtifactError

    view = SimpleNamespace(root="m.dz", manifest={"memory_plan": plan})
    with pytest.raises(ArtifactError, match="memory plan is malformed"):
        _memory_slots(view)
    good = {"buffers": [{"value": "a", "offset": 4, "size": 4}], "arena_bytes": 8}
    assert _memory_slots(SimpleNamespace(root="m.dz", manifest={"memory_plan": good})) == (
        {"a": (4, 4)}, 8)
