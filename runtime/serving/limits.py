"""Request bodies, bounded in size and in time before the routes see them (an ASGI middleware).

A body may hold at most `max_bytes` (16 MiB: a long prompt is a few MB, an image a few more):
a larger Content-Length is refused with 413 before a byte of the body is read, and a body sent
without one (chunked) is refused with 413 as soon as it passes the limit. The whole body must
arrive within `timeout` seconds of the request's head (408 after it), so a client that
announces a body and never sends it frees its connection. Both answers are in OpenAI's error
shape and close the connection (the unread rest of the body cannot be skipped safely).

The routes then read the body from memory: the middleware hands it over as one message and
passes the server's later messages (the disconnect a handler listens for) through.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from .errors import error_body

MAX_BODY_BYTES = 16 * 2**20
BODY_TIMEOUT_S = 30.0


class _TooLarge(Exception):
    pass


class BodyLimits:
    def __init__(self, app, max_bytes: int = MAX_BODY_BYTES, timeout: float = BODY_TIMEOUT_S,
                 on_refuse: Callable[[str, int], None] | None = None):
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.on_refuse = on_refuse  # (path, status): counted in the metrics

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, send, 413, f"the request body is {declared} bytes; at "
                               f"most {self.max_bytes} are accepted")
            return
        try:
            body = await asyncio.wait_for(self._read(receive), self.timeout)
        except asyncio.TimeoutError:
            await self._refuse(scope, send, 408, f"the request body did not arrive within "
                               f"{self.timeout:g} s")
            return
        except _TooLarge:
            await self._refuse(scope, send, 413, f"the request body is more than "
                               f"{self.max_bytes} bytes; at most {self.max_bytes} are accepted")
            return
        if body is None:  # the client left before sending all of it
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive) -> bytes | None:
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refuse(self, scope: dict, send, status: int, message: str) -> None:
        if self.on_refuse is not None:
            self.on_refuse(scope.get("path", ""), status)
        payload = json.dumps(error_body(message, "invalid_request_error", "body")).encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload)),
            (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})


def _content_length(scope: dict) -> int | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:  # the HTTP server refuses it first; never trust it here
                return None
    return None


def _replay(body: bytes, receive) -> Callable[[], Any]:
    """A `receive` that gives `body` as the whole request, then the server's messages."""
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
