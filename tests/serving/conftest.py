"""A real `dayzero serve` on 127.0.0.1 for the serving tests: a subprocess on a free port, waited
for until /health answers 200, stopped with SIGTERM (it has to exit 0).

The artifact is the tiny Llama checkpoint with a word tokenizer and a chat template
(tests/generation/tiny_lms.py), compiled as `dayzero compile FOLDER` does, for 256 positions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.serving.servers import KV_CACHE, Server


@pytest.fixture(scope="session")
def artifact(tmp_path_factory) -> Path:
    from compiler.cli import main
    from tests.generation.tiny_lms import checkpoint_folder

    root = tmp_path_factory.mktemp("serve")
    checkpoint_folder(root / "ckpt")
    out = root / "lm.dz"
    assert main(["compile", str(root / "ckpt"), "-o", str(out), "--seq-len", "2:256",
                 "-q"]) == 0
    return out


@pytest.fixture(scope="session")
def reference(artifact):
    """The same artifact loaded in this process: what `generate` says."""
    import runtime

    return runtime.load(artifact, kv_cache_memory=KV_CACHE)


@pytest.fixture(scope="session")
def server(artifact, tmp_path_factory):
    srv = Server(artifact, tmp_path_factory.mktemp("log") / "server.log")
    yield srv
    assert srv.stop() == 0, srv.log.read_text()
