"""An artifact's chat template, rendered in worker processes with hard limits.

The template is Jinja source from an artifact, so untrusted: rendered in-process, two nested
range(100000) loops held a server's every endpoint and 9 GB, `{{ content * 100000000 }}`
aborted it, and nothing could stop either. Jinja's sandbox blocks unsafe attributes, not work.
Here each render runs in a worker (chat_template_worker.py, started lazily and reused, so a
chat request pays a pipe round trip, not an interpreter start) limited to 1 s of CPU, 256 MiB of
address space, 1 MiB of output (cut as it streams) and 5 s of wall time; past the CPU,
memory or wall limit the worker ends or is killed, and the next render starts a fresh one. The
caller waits on a pipe with a deadline, so `close()` (a server stopping) ends a render at once.

Requests and replies are JSON, never pickle: the worker sees nothing but text and plain data.
Every failure is a ChatTemplateError (an InputError: to a server, a 400) naming the template.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.errors import DayzeroError, InputError

from . import chat_template_worker as wire

_WORKER_FILE = str(Path(wire.__file__).resolve())
# loads the worker by path, not through the `runtime` package (whose imports bring numpy and
# the backends); -I: no PYTHON* variables, no user site, no current folder on sys.path
_BOOT = ("import sys, json, importlib.util as u; sys.path[:] = json.loads(sys.argv[1]); "
         "s = u.spec_from_file_location('dayzero_chat_template_worker', sys.argv[2]); "
         "m = u.module_from_spec(s); s.loader.exec_module(m); m.main()")
_START_S = 20.0  # an interpreter start and `import jinja2`, on a loaded machine
MAX_REQUEST = 16 << 20  # the messages, as JSON (a server's body limit)
MAX_TEMPLATE = 1 << 20  # real chat templates are a few KB; the source travels with each render
# the worker may stay in use after these errors (it caught them itself, its state is sound)
_RECOVERABLE = ("syntax", "runtime", "refused", "output")


class ChatTemplateError(InputError):
    """A chat template that fails, overruns a limit, or refuses the messages."""


@dataclass(frozen=True)
class Limits:
    cpu_s: float = 1.0
    memory: int = 256 << 20
    output: int = 1 << 20
    wall_s: float = 5.0


LIMITS = Limits()


_LIVE: weakref.WeakSet[ChatTemplate] = weakref.WeakSet()


class ChatTemplate:
    """Renders one template; safe to call from several threads (up to `workers` renders run
    at once, others wait for a free worker)."""

    def __init__(self, source: str, name: str, limits: Limits = LIMITS, workers: int = 2):
        self.source, self.name, self.limits = source, name, limits
        self._size = len(source.encode("utf-8", "surrogatepass"))
        self._source_json = json.dumps(source, ensure_ascii=True)
        self._workers = max(1, workers)
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._count = 0  # workers started or starting, idle or busy
        self._busy: set[_Worker] = set()
        self._closed = False
        self._pid = os.getpid()
        _LIVE.add(self)

    def __del__(self) -> None:  # idle workers would exit at end-of-file; this reaps them too
        if hasattr(self, "_pid"):
            try:
                self.close()
            except Exception:  # noqa: BLE001 - interpreter teardown: modules half gone
                pass

    def render(self, context: Mapping[str, Any]) -> str:
        """The template rendered with `context` (JSON-like values: dicts, lists, str, numbers,
        bool, None), as Jinja renders it in-process."""
        request = self._request(context)
        worker = self._take()
        reply: Any = None
        try:
            reply = worker.request(request)
        except _NoReply as exc:
            reply = exc
        finally:
            self._give_back(worker, isinstance(reply, dict) and (
                "text" in reply or reply.get("error") in _RECOVERABLE))
        return self._text(reply)

    def close(self) -> None:
        """Kill the workers; a render in progress in another thread ends at once with a
        ChatTemplateError, and every later render fails the same way."""
        with self._cond:
            self._forget_if_forked()
            self._closed = True
            idle, busy = self._idle, list(self._busy)
            self._idle = []
            self._cond.notify_all()
        for worker in busy:
            worker.terminate()  # its render thread sees end-of-file, then reaps it
        for worker in idle:
            worker.discard()

    def __enter__(self) -> ChatTemplate:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _request(self, context: Mapping[str, Any]) -> bytes:
        if self._size > MAX_TEMPLATE:
            raise self._error(f"the chat template {self.name} is larger than "
                              f"{_amount(MAX_TEMPLATE)}")
        try:
            data = json.dumps(dict(context), ensure_ascii=True, default=_plain)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ChatTemplateError(f"the messages cannot be passed to the chat template: "
                                    f"{exc}", "messages", "pass strings, numbers, lists and "
                                    "dicts only") from None
        if len(data) > MAX_REQUEST:
            raise ChatTemplateError(f"the messages are more than {_amount(MAX_REQUEST)} as JSON",
                                    "messages", "send shorter messages")
        body = (f'{{"cpu_s": {json.dumps(self.limits.cpu_s)}, "output": {self.limits.output}, '
                f'"template": {self._source_json}, "context": {data}}}').encode("ascii")
        return wire.HEADER.pack(len(body)) + body

    def _take(self) -> _Worker:
        with self._cond:
            self._forget_if_forked()
            while not self._closed and not self._idle and self._count >= self._workers:
                self._cond.wait()
            if self._closed:
                raise self._closed_error()
            if self._idle:
                worker = self._idle.pop()
            else:
                worker = _Worker(self.limits)
                self._count += 1
            self._busy.add(worker)
            return worker

    def _forget_if_forked(self) -> None:
        """In a forked child the workers (and their pipes) are the parent's: start afresh."""
        if os.getpid() != self._pid:
            self._idle, self._busy, self._count, self._pid = [], set(), 0, os.getpid()

    def _give_back(self, worker: _Worker, healthy: bool) -> None:
        with self._cond:
            if worker not in self._busy:  # taken in the parent of a fork: not this process's
                return
            self._busy.discard(worker)
            keep = healthy and not self._closed and worker.alive()
            if keep:
                self._idle.append(worker)
            else:
                self._count -= 1
            self._cond.notify()
        if not keep:
            worker.discard()

    def _text(self, reply: Any) -> str:
        if isinstance(reply, dict) and isinstance(reply.get("text"), str):
            return reply["text"]
        if self._closed:
            raise self._closed_error()
        if isinstance(reply, _NoReply):
            raise self._no_reply(reply)
        if not isinstance(reply, dict) or not isinstance(reply.get("error"), str):
            raise self._error(f"the chat template renderer sent a malformed reply for "
                              f"{self.name}")
        kind, message = reply["error"], str(reply.get("message", ""))
        line = reply.get("line") if isinstance(reply.get("line"), int) else None
        if kind == "refused":
            raise ChatTemplateError(f"the chat template ({self.name}) refused the messages: "
                                    f"{message}", "messages", "follow the roles and order the "
                                    "model's template expects")
        what = {"syntax": f"does not parse: {message}", "runtime": f"fails: {message}",
                "cpu": f"used more than {self.limits.cpu_s:g} s of CPU",
                "memory": f"needed more than {_amount(self.limits.memory)} of memory",
                "output": f"wrote more than {_amount(self.limits.output)} of output"}
        raise self._error(f"the chat template {self.name} "
                          f"{what.get(kind, f'could not be rendered: {message}')}", line)

    def _no_reply(self, reply: _NoReply) -> DayzeroError:
        if reply.reason == "start":
            return DayzeroError(f"the chat template renderer did not start: {reply.detail}",
                                self.name, "check that jinja2 is installed in this Python")
        if reply.reason == "wall":
            return self._error(f"the chat template {self.name} took more than "
                               f"{self.limits.wall_s:g} s")
        code = reply.code
        if reply.detail:
            return self._error(f"the chat template renderer sent {reply.detail} for {self.name}")
        if code == -signal.SIGXCPU:  # RLIMIT_CPU ended a loop the CPU timer could not interrupt
            return self._error(f"the chat template {self.name} used more than "
                               f"{self.limits.cpu_s:g} s of CPU")
        return self._error(f"the chat template {self.name} crashed its renderer (exit status "
                           f"{code}; out of its {_amount(self.limits.memory)} of memory, or "
                           "recursing too deep)")

    def _error(self, what: str, line: int | None = None) -> ChatTemplateError:
        where = self.name if line is None else f"{self.name}, line {line}"
        return ChatTemplateError(what, where, "the template is part of the artifact: "
                                 "recompile from a checkpoint whose chat template works, or "
                                 "send a plain prompt")

    def _closed_error(self) -> ChatTemplateError:
        return ChatTemplateError("the chat template renderer was closed (the model is being "
                                 "unloaded, or the server is stopping)", self.name,
                                 "load the model again to render chat messages")


class _NoReply(Exception):
    def __init__(self, reason: str, detail: str = "", code: int | None = None):
        super().__init__(reason)
        self.reason, self.detail, self.code = reason, detail, code


class _Worker:
    """One worker process, used by one thread at a time (ChatTemplate checks it out). Only
    `terminate` may be called from another thread: it signals, and the owner reaps."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.proc: subprocess.Popen | None = None
        self.terminated = False

    def request(self, frame: bytes) -> Any:
        """The worker's reply to `frame` (started first if needed); _NoReply if none came."""
        if self.proc is None:
            self._start()
        deadline = time.monotonic() + self.limits.wall_s
        self._send(frame, deadline)
        return self._receive(deadline)

    def _start(self) -> None:
        paths = json.dumps([p for p in sys.path if p])
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _BOOT, paths, _WORKER_FILE,
                 str(self.limits.memory)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                start_new_session=True)  # a terminal's Ctrl-C goes to the parent only
        except OSError as exc:
            raise _NoReply("start", str(exc)) from None
        if self.terminated:  # close() ran while the process was starting
            self.terminate()
        os.set_blocking(self.proc.stdin.fileno(), False)
        reply = self._receive(time.monotonic() + _START_S)
        if not isinstance(reply, dict) or reply.get("ready") is not True:
            detail = reply.get("message") if isinstance(reply, dict) else reply
            raise _NoReply("start", str(detail))

    def _send(self, data: bytes, deadline: float) -> None:
        fd = self.proc.stdin.fileno()
        view = memoryview(data)
        while view:
            self._wait(fd, deadline, write=True)
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                continue
            except OSError:  # the worker died: its exit status says why
                raise self._ended(deadline) from None

    def _receive(self, deadline: float) -> Any:
        (size,) = wire.HEADER.unpack(self._read(wire.HEADER.size, deadline))
        if size > wire.MAX_FRAME:
            raise _NoReply("died", "a reply frame too large")
        try:
            return json.loads(self._read(size, deadline))
        except ValueError:
            raise _NoReply("died", "a malformed reply") from None

    def _read(self, n: int, deadline: float) -> bytes:
        fd = self.proc.stdout.fileno()
        data = bytearray()
        while len(data) < n:
            self._wait(fd, deadline)
            chunk = os.read(fd, n - len(data))  # poll said readable: this does not block
            if not chunk:
                raise self._ended(deadline)
            data += chunk
        return bytes(data)

    def _wait(self, fd: int, deadline: float, write: bool = False) -> None:
        """Until `fd` is ready; past the deadline the worker is killed (a blocked or stopped
        process included). A terminate() from another thread ends the wait by end-of-file."""
        poller = select.poll()  # not select(): a server's descriptors pass 1024
        poller.register(fd, select.POLLOUT if write else select.POLLIN)
        left_ms = math.ceil(max(deadline - time.monotonic(), 0) * 1000)
        if not poller.poll(left_ms):
            self.terminate()
            raise _NoReply("wall")

    def _ended(self, deadline: float) -> _NoReply:
        try:
            code = self.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            self.terminate()
            return _NoReply("wall")
        return _NoReply("died", code=code)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and not self.terminated

    def terminate(self) -> None:
        """SIGKILL, from any thread (the pipes stay open: the owner may be reading them)."""
        self.terminated = True
        proc = self.proc
        if proc is not None and proc.returncode is None:
            try:
                proc.kill()
            except OSError:
                pass

    def discard(self) -> None:
        """Kill, reap and close the pipes: by the owning thread, or for an idle worker."""
        self.terminate()
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass  # unkillable (stuck in the kernel): Popen reaps it later
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


def _plain(value: Any) -> Any:
    """JSON for what json does not take natively: mappings other than dict."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"a {type(value).__name__} is not JSON data")


def _amount(nbytes: int) -> str:
    if nbytes >= 1 << 20 and nbytes % (1 << 20) == 0:
        return f"{nbytes >> 20} MiB"
    return f"{nbytes} bytes"


@atexit.register
def _close_all() -> None:
    """No worker outlives the process (an idle one would exit on end-of-file anyway)."""
    for template in list(_LIVE):
        template.close()
