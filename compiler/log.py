"""Staged log lines with times ("export 1.23s"), and progress bars for long steps.

The driver takes a `StageLog` explicitly; the library API is silent unless given one, the CLI
passes one that writes to stderr (none with --quiet). On a terminal each stage also shows a bar
with its elapsed time, refreshed twice a second: torch.export of a large model and its lowering
run for minutes without a line, and a user must see that they are alive. Elsewhere (a log
file, CI) the stage lines alone are written, so logs stay free of carriage returns.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TextIO


class StageLog:
    def __init__(self, stream: TextIO | None = None, progress: bool | None = None):
        self.stream = stream
        self.progress_enabled = progress if progress is not None else bool(
            stream is not None and stream.isatty())
        self.times: dict[str, float] = {}

    def line(self, text: str) -> None:
        if self.stream is not None:
            print(text, file=self.stream, flush=True)

    @contextlib.contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[None]:
        start = time.perf_counter()
        self.line(f"[{name}] {detail}".rstrip() + " ...")
        with self._ticking(name):
            yield
        elapsed = time.perf_counter() - start
        self.times[name] = self.times.get(name, 0.0) + elapsed
        self.line(f"[{name}] done in {elapsed:.2f}s")

    @contextlib.contextmanager
    def _ticking(self, name: str) -> Iterator[None]:
        """An elapsed-time bar for the stage, on a terminal only."""
        if not self.progress_enabled:
            yield
            return
        from tqdm import tqdm

        bar = tqdm(desc=f"[{name}]", bar_format="{desc} {elapsed}", file=self.stream,
                   leave=False)
        done = threading.Event()

        def tick() -> None:
            while not done.wait(0.5):
                bar.refresh()

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield
        finally:
            done.set()
            ticker.join()
            bar.close()

    def progress(self, total: int, desc: str, unit: str = "B") -> Callable[[int], None] | None:
        """A callback advancing a progress bar by n units; None when bars are off."""
        if not self.progress_enabled:
            return None
        from tqdm import tqdm

        bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=True, file=self.stream,
                   leave=False)
        return bar.update


SILENT = StageLog(None)
