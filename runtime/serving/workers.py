"""Reading requests off the event loop: each on a daemon thread, at most `limit` at once.

Decoding a 16 MiB body, rendering a chat template and tokenizing a long prompt take from
milliseconds to seconds; on the event loop they would hold up every other connection (a health
check waited 18 s behind one 10 MB prompt). They run here instead, and the loop awaits the
result.

Why not `asyncio.to_thread`: its executor's threads are not daemons, and both the interpreter's
exit and `asyncio.run`'s shutdown join them, so one slow render would keep a SIGTERMed server
alive until it ended. These threads are daemons: at shutdown `abandon` answers every request
still being read (503) and the process exits without waiting for them. A thread keeps its slot
until its work really ends, so hostile requests that never finish can fill the slots (later
requests wait for one) but never add threads beyond `limit`.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from typing import Any


def default_limit() -> int:
    """Threads for reading requests: the CPUs this process may use, between 2 and 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 2
    return max(2, min(8, cpus))


class Workers:
    def __init__(self, limit: int | None = None):
        self.limit = limit or default_limit()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None
        self._pending: set[asyncio.Future] = set()

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on a worker thread; its result, or its exception raised here."""
        loop = asyncio.get_running_loop()
        if self._slots is None or self._loop is not loop:
            self._loop, self._slots = loop, asyncio.Semaphore(self.limit)
        slots = self._slots
        await slots.acquire()
        future = loop.create_future()
        self._pending.add(future)
        thread = threading.Thread(target=_work, args=(loop, slots, future, fn, args),
                                  name="dayzero-read", daemon=True)
        try:
            thread.start()
        except BaseException:
            slots.release()
            self._pending.discard(future)
            raise
        try:
            return await future
        finally:
            self._pending.discard(future)

    def abandon(self, error: Callable[[], BaseException]) -> None:
        """Any thread: every request still being read raises `error()` now (its thread runs on
        and is forgotten)."""
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._abandon, error)
        except RuntimeError:  # the loop has closed: nobody is waiting
            pass

    def _abandon(self, error: Callable[[], BaseException]) -> None:
        for future in list(self._pending):
            if not future.done():
                future.set_exception(error())


def _work(loop: asyncio.AbstractEventLoop, slots: asyncio.Semaphore, future: asyncio.Future,
          fn: Callable[..., Any], args: tuple) -> None:
    result: Any = None
    error: BaseException | None = None
    try:
        result = fn(*args)
    except Exception as exc:
        error = exc
    except BaseException as exc:  # noqa: BLE001 - a panic from native code: an ordinary error
        error = RuntimeError(f"{type(exc).__name__}: {exc}")
    try:
        loop.call_soon_threadsafe(_settle, slots, future, result, error)
    except RuntimeError:  # the loop has closed
        pass


def _settle(slots: asyncio.Semaphore, future: asyncio.Future, result: Any,
            error: BaseException | None) -> None:
    slots.release()
    if future.done():  # cancelled (the client left) or abandoned (a shutdown)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
