"""compiler.ir.collector: the pause is scoped and nests; the pass manager and the writer use it."""

from __future__ import annotations

import gc

from compiler.ir.collector import collection_paused
from passes import PassManager
from tests.passes.fusion_util import fuse_text


def test_the_pause_nests_and_restores_the_collector():
    assert gc.isenabled()
    with collection_paused():
        assert not gc.isenabled()
        with collection_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()
    gc.disable()
    try:
        with collection_paused():
            pass
        assert not gc.isenabled()  # a collector the caller turned off stays off
    finally:
        gc.enable()


def test_passes_run_with_the_collector_paused_and_restore_it(monkeypatch):
    seen = []
    real_run = PassManager._run_one

    def spy(self, *args):
        seen.append(gc.isenabled())
        return real_run(self, *args)

    monkeypatch.setattr(PassManager, "_run_one", spy)
    graph, _ = fuse_text("""
        graph main {
          input %x: f32[4]
          %y: f32[4] = add(%x, %x)
          return %y
        }
    """, "remove_noops,eliminate_dead_code")
    assert seen == [False, False] and gc.isenabled()
