"""The process that renders chat templates (started by chat_template.py, never imported by it
for anything but the framing).

A chat template is Jinja source taken from an artifact: it can loop 10^10 times, build a
gigabyte string or recurse until the C stack ends, and Jinja's sandbox stops none of that (it
only blocks unsafe attribute access). So it runs here, in a process of its own whose memory is
capped by RLIMIT_AS, whose CPU per render is capped by a profiling timer (a precise 1 s, raised
as an exception between bytecodes) backed by RLIMIT_CPU (SIGXCPU kills a C-level loop the
timer cannot interrupt), and whose output is counted as it streams. The parent adds a wall-clock
deadline and kills this process on any overrun.

Only the standard library and jinja2 are imported: the file is loaded by path (see `main`), not
through the `runtime` package, so numpy and the backends never enter a 256 MiB address space.

Protocol: frames of a 4-byte big-endian length and ASCII JSON (lone surrogates travel as \\ud800
escapes), on stdin/stdout. First frame out: {"ready": true} or {"error": "start", ...}. Then per
request {"template", "context", "cpu_s", "output"} one reply: {"text": str} or {"error": KIND,
"message": str, "line": int | None}. After a "cpu" or "memory" error the process exits: an
exception raised at an arbitrary point may leave Jinja's caches half-updated.
"""

from __future__ import annotations

import json
import math
import os
import resource
import signal
import struct
import sys
from typing import Any, BinaryIO

HEADER = struct.Struct(">I")
MAX_FRAME = 64 << 20  # a request holds the template and the messages; both are capped below this
FATAL = ("cpu", "memory")  # errors after which the worker exits
_CACHE_SIZE = 8  # compiled templates kept (keyed by source): a server renders one template


class _CpuOverrun(BaseException):
    """Raised by the SIGPROF handler. A BaseException, so no `except Exception` in Jinja or in
    a template's filters can swallow it."""


class _Refused(Exception):
    """raise_exception() called by the template: the messages, not the template, are wrong."""


def encode_frame(message: Any) -> bytes:
    data = json.dumps(message, ensure_ascii=True).encode("ascii")
    return HEADER.pack(len(data)) + data


def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _read_frame(stream: BinaryIO) -> Any:
    header = _read_exact(stream, HEADER.size)
    if header is None:
        return None
    (size,) = HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"a request frame of {size} bytes")
    data = _read_exact(stream, size)
    return None if data is None else json.loads(data)


def _environment():
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: Any) -> None:
        raise _Refused(str(message))

    # exactly the environment transformers' apply_chat_template renders with (and the one
    # dayzero rendered with in-process before): same options, filter and global
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, indent=indent)
    env.globals["raise_exception"] = raise_exception
    return env


def _nbytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _template_line(exc: BaseException) -> int | None:
    """The template line an exception came from: Jinja rewrites tracebacks so that template
    frames carry the file name <template> and the template's own line numbers."""
    line = getattr(exc, "lineno", None)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line if isinstance(line, int) else None


def _error(kind: str, message: str, exc: BaseException | None = None) -> dict[str, Any]:
    return {"error": kind, "message": message[:1000],
            "line": None if exc is None else _template_line(exc)}


class Renderer:
    def __init__(self):
        self.env = _environment()
        self.cache: dict[str, Any] = {}

    def render(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request's reply; CPU-limited from the template's compile to its last chunk."""
        _arm_cpu(float(request["cpu_s"]))
        try:
            return self._render(request["template"], request["context"], int(request["output"]))
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)

    def _render(self, source: str, context: dict[str, Any], limit: int) -> dict[str, Any]:
        from jinja2 import TemplateSyntaxError

        try:
            template = self._compiled(source)
        except TemplateSyntaxError as exc:
            return _error("syntax", str(exc), exc)
        pieces, size = [], 0
        stream = template.generate(**context)
        try:
            for chunk in stream:
                size += _nbytes(chunk)
                if size > limit:
                    return _error("output", f"more than {limit} bytes")
                pieces.append(chunk)
        finally:
            stream.close()
        return {"text": "".join(pieces)}

    def _compiled(self, source: str):
        if source not in self.cache:
            if len(self.cache) >= _CACHE_SIZE:
                self.cache.pop(next(iter(self.cache)))
            self.cache[source] = self.env.from_string(source)  # compiling runs template code
        return self.cache[source]  # (constant folding), so it is limited like rendering


def _arm_cpu(cpu_s: float) -> None:
    """The timer raises _CpuOverrun after `cpu_s` of this process's CPU; RLIMIT_CPU (whole
    seconds of total CPU) kills the process within a second more if the timer could not run
    its handler (a C-level loop such as `list in list`)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    backstop = max(math.ceil(usage.ru_utime + usage.ru_stime + cpu_s), 1)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        backstop = min(backstop, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (backstop, hard))
    signal.setitimer(signal.ITIMER_PROF, cpu_s)


def _on_sigprof(signum, frame) -> None:
    raise _CpuOverrun


def _reply(renderer: Renderer, request: Any) -> dict[str, Any]:
    try:
        return renderer.render(request)
    except _CpuOverrun:
        return _error("cpu", "CPU time")
    except MemoryError:
        return _error("memory", "memory")
    except _Refused as exc:
        return _error("refused", str(exc), exc)
    except RecursionError as exc:
        return _error("runtime", "RecursionError: the template recursed too deep", exc)
    except Exception as exc:  # noqa: BLE001 - any failure of untrusted template code is a reply
        return _error("runtime", f"{type(exc).__name__}: {exc}", exc)


def _limit_memory(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no core file behind
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard if hard != resource.RLIM_INFINITY
                                            else limit))


def serve(memory: int, stdin: BinaryIO, stdout: BinaryIO) -> None:
    """Answer requests until stdin closes (the parent exited or closed the pipe)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    try:
        renderer = Renderer()
        signal.signal(signal.SIGPROF, _on_sigprof)
        _limit_memory(memory)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which names it
        stdout.write(encode_frame(_error("start", f"{type(exc).__name__}: {exc}")))
        stdout.flush()
        return
    stdout.write(encode_frame({"ready": True}))
    stdout.flush()
    while True:
        try:
            request = _read_frame(stdin)
        except MemoryError:
            request, reply = None, _error("memory", "memory")
        except ValueError as exc:
            request, reply = None, _error("request", str(exc))
        else:
            if request is None:
                return
            reply = _reply(renderer, request)
        stdout.write(encode_frame(reply))
        stdout.flush()
        if request is None or reply.get("error") in FATAL:
            return


def main() -> None:
    serve(int(sys.argv[-1]), sys.stdin.buffer, sys.stdout.buffer)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: nothing to save, and it may be out of memory


if __name__ == "__main__":
    main()
