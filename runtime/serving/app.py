"""The HTTP routes: OpenAI's completions, chat completions and models, plus health and metrics.

A body has at most 16 MiB and 30 s to arrive (limits.py: 413, 408). A handler then has it
decoded and checked on a worker thread (workers.py, protocol.py: 400 naming the field), never
on the event loop, so /health and every other request are answered while one is tokenized or
its chat template rendered. It admits the request to the engine (429 with Retry-After when
the queue is full, 503 while warming up or draining), then answers from the request's queue of
`Delta`s: all at once, or as server-sent events (`data: {...}` per chunk, then `data: [DONE]`).
A handler that leaves before its request ended (the client disconnected, the stream was
cancelled) cancels it on the engine, which frees its blocks. Every error, the routes' own 404
and 405 included, is in OpenAI's error shape.

A sequence the model fails (NaN or +inf logits) ends with finish_reason "error": the request
was fine, so what was generated before is kept. A whole answer with tokens is a 200 whose
choice has finish_reason "error" and an `error` object; with no token at all there is nothing
to answer with, and it is a 500 (type server_error) saying why. A stream sends its last chunk
with finish_reason "error", then the error object (the official clients raise it), then
`[DONE]`. The other requests of the batch go on.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from .bounds import prompt_char_limit
from .engine import Delta, Engine, Job, NotAccepting, QueueFull
from .errors import error_body
from .limits import BODY_TIMEOUT_S, MAX_BODY_BYTES, BodyLimits
from .metrics import Metrics
from .protocol import GenerationRequest, ProtocolError, read_request
from .workers import Workers

RETRY_AFTER_S = 1
GENERATION_ENDPOINTS = ("/v1/completions", "/v1/chat/completions")


def create_app(model, model_name: str, engine: Engine, metrics: Metrics,
               workers: Workers | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               body_timeout: float = BODY_TIMEOUT_S,
               max_model_len: int | None = None) -> FastAPI:
    """The routes over `engine`; requests are read on `workers` (the server abandons them
    there at the drain's deadline). `max_model_len`: the context served (prompt and new
    tokens), at most the artifact's positions (None: all of them)."""
    app = FastAPI(title=f"dayzero serve {model_name}", docs_url=None, redoc_url=None,
                  openapi_url=None)
    created = int(time.time())
    workers = workers or Workers()
    max_chars = prompt_char_limit(model)
    context = min(model.spec.max_positions, max_model_len or model.spec.max_positions)

    def count(endpoint: str, status: int) -> None:
        if endpoint in GENERATION_ENDPOINTS:  # no label per path a client makes up
            metrics.requests.labels(endpoint, str(status)).inc()

    app.add_middleware(BodyLimits, max_bytes=max_body_bytes, timeout=body_timeout,
                       on_refuse=count)
    _error_shapes(app)

    def refuse(endpoint: str, error: ProtocolError) -> JSONResponse:
        count(endpoint, error.status)
        headers = {"Retry-After": str(RETRY_AFTER_S)} if error.status == 429 else None
        return JSONResponse(error.body(), error.status, headers=headers)

    async def admit(request: Request, chat: bool) -> tuple[GenerationRequest, Job]:
        """The request read and checked off the event loop, then admitted to the engine."""
        try:
            engine.open_request()
        except NotAccepting as exc:
            raise _unavailable(exc) from None
        try:
            raw = await request.body()
            parsed = await workers.run(read_request, raw, chat, model_name, model, max_chars,
                                       context)
        except NotAccepting as exc:  # abandoned at the drain's deadline
            engine.close_request()
            raise _unavailable(exc) from None
        except BaseException:
            engine.close_request()
            raise
        try:
            return parsed, engine.submit(parsed, asyncio.get_running_loop(), opened=True)
        except QueueFull as exc:
            raise ProtocolError(None, f"the server is busy: {exc}; retry later", 429,
                                "rate_limit_error") from None
        except NotAccepting as exc:
            raise _unavailable(exc) from None

    async def generate(request: Request, chat: bool):
        endpoint = request.url.path
        try:
            parsed, job = await admit(request, chat)
        except ProtocolError as error:
            return refuse(endpoint, error)
        shape = _Shape(chat, model_name, parsed)
        if parsed.stream:
            metrics.requests.labels(endpoint, "200").inc()
            return StreamingResponse(_events(engine, job, shape),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        deltas = await _collect(engine, job, request)
        if deltas is None:  # the client went away
            metrics.requests.labels(endpoint, "499").inc()
            return Response(status_code=499)
        last = deltas[-1]
        if last.error is not None and not any(d.tokens for d in deltas):
            metrics.requests.labels(endpoint, "500").inc()
            return JSONResponse(error_body(last.error, "server_error"), 500)
        metrics.requests.labels(endpoint, "200").inc()
        return JSONResponse(shape.whole(job, deltas))

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, chat=True)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model",
                                            "created": created, "owned_by": "dayzero",
                                            "max_model_len": context}]}

    @app.get("/health")
    async def health():
        state = engine.state
        body = {"status": state}
        if engine.failure is not None:
            body["error"] = engine.failure
        return JSONResponse(body, 200 if state == "ok" else 503)

    @app.get("/metrics")
    async def metrics_text():
        content, content_type = metrics.render()
        return Response(content, media_type=content_type)

    return app


def _unavailable(exc: Exception) -> ProtocolError:
    return ProtocolError(None, f"the server is not accepting requests ({exc})", 503,
                         "unavailable")


def _error_shapes(app: FastAPI) -> None:
    """The framework's own errors (an unknown path, a wrong method, an internal error) in
    OpenAI's error shape, as the routes' are: a client parses every answer alike."""

    async def http_error(_request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind), exc.status_code,
                            headers=getattr(exc, "headers", None))

    async def invalid(_request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(str(exc)[:300], "invalid_request_error"), 400)

    async def internal(_request, exc: Exception) -> JSONResponse:
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}",
                                       "server_error"), 500)

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(Exception, internal)


async def _collect(engine: Engine, job: Job, request) -> list[Delta] | None:
    """Every delta of `job` up to its end; None (and the job cancelled) if the client left."""
    deltas: list[Delta] = []
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        while True:
            delta = asyncio.ensure_future(job.events.get())
            await asyncio.wait({delta, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not delta.done():
                delta.cancel()
                return None
            deltas.append(delta.result())
            if deltas[-1].finish_reason is not None:
                return deltas
    finally:
        gone.cancel()
        if not deltas or deltas[-1].finish_reason is None:
            engine.cancel(job)


async def _disconnected(request) -> None:
    """Returns when the client closes the connection (the body has been read: the server's
    next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _events(engine: Engine, job: Job, shape: _Shape):
    """Server-sent events for a streamed request; cancels it if the stream stops early (the
    client disconnected: Starlette cancels this generator)."""
    ended = False
    try:
        first = shape.first_chunk()
        if first is not None:
            yield _sse(first)
        failed = False
        while not ended:
            delta = await job.events.get()
            ended = delta.finish_reason is not None
            # a completion chunk carries the step's token ids even when its text is held back
            # (a possible stop string, half a character, no tokenizer)
            if delta.text or ended or (delta.tokens and not shape.chat):
                yield _sse(shape.chunk(delta))
            if delta.error is not None:
                failed = True
                yield _sse(error_body(delta.error, "server_error"))
        if shape.request.include_usage and not failed:
            yield _sse(shape.usage_chunk(job))
        yield "data: [DONE]\n\n"
    finally:
        if not ended:
            engine.cancel(job)


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


class _Shape:
    """OpenAI's response objects for one request."""

    def __init__(self, chat: bool, model_name: str, request: GenerationRequest):
        self.chat, self.model, self.request = chat, model_name, request
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, job: Job, deltas: list[Delta]) -> dict[str, Any]:
        text = "".join(d.text for d in deltas)
        reason = _reason(deltas[-1].finish_reason)
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason,
                      "token_ids": job.sequence.generated}
        if deltas[-1].error is not None:  # what was generated stands; why it ended, too
            choice["error"] = error_body(deltas[-1].error, "server_error")["error"]
        return {**self._head("chat.completion" if self.chat else "text_completion"),
                "choices": [choice], "usage": _usage(job)}

    def first_chunk(self) -> dict[str, Any] | None:
        if not self.chat:
            return None
        return {**self._head("chat.completion.chunk"), "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
             "finish_reason": None}]}

    def chunk(self, delta: Delta) -> dict[str, Any]:
        reason = _reason(delta.finish_reason)
        if self.chat:
            choice = {"index": 0, "delta": {"content": delta.text} if delta.text else {},
                      "logprobs": None, "finish_reason": reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        return {**self._head("text_completion"), "choices": [
            {"index": 0, "text": delta.text, "logprobs": None, "finish_reason": reason,
             "token_ids": delta.tokens}]}

    def usage_chunk(self, job: Job) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(kind), "choices": [], "usage": _usage(job)}


def _reason(reason: str | None) -> str | None:
    return "stop" if reason == "cancelled" else reason  # a client never sees its own cancel


def _usage(job: Job) -> dict[str, Any]:
    return {"prompt_tokens": job.prompt_tokens, "completion_tokens": job.completion_tokens,
            "total_tokens": job.prompt_tokens + job.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": job.sequence.cached_prompt_tokens}}
