"""The HTTP routes: OpenAI's completions, chat completions and models, plus health and metrics.

A handler reads the body (protocol.py checks it: 400 naming the field), admits it to the engine
(429 with Retry-After when the queue is full, 503 while warming up or draining), then answers
from the request's queue of `Delta`s: all at once, or as server-sent events (`data: {...}` per
chunk, then `data: [DONE]`). A handler that leaves before its request ended (the client
disconnected, the stream was cancelled) cancels it on the engine, which frees its blocks.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .engine import Delta, Engine, Job, NotAccepting, QueueFull
from .metrics import Metrics
from .protocol import GenerationRequest, ProtocolError, parse_request

RETRY_AFTER_S = 1


def create_app(model, model_name: str, engine: Engine, metrics: Metrics) -> FastAPI:
    app = FastAPI(title=f"dayzero serve {model_name}", docs_url=None, redoc_url=None,
                  openapi_url=None)
    created = int(time.time())

    def refuse(endpoint: str, error: ProtocolError) -> JSONResponse:
        metrics.requests.labels(endpoint, str(error.status)).inc()
        headers = {"Retry-After": str(RETRY_AFTER_S)} if error.status == 429 else None
        return JSONResponse(error.body(), error.status, headers=headers)

    async def generate(request: Request, chat: bool):
        endpoint = request.url.path
        try:
            if engine.state != "ok":
                raise NotAccepting(engine.state)
            body = _decode(await request.body())
            if getattr(model, "vision", None) is not None:  # images decode and encode here
                parsed = await asyncio.to_thread(parse_request, body, chat, model_name, model)
            else:
                parsed = parse_request(body, chat, model_name, model)
            job = engine.submit(parsed, asyncio.get_running_loop())
        except ProtocolError as error:
            return refuse(endpoint, error)
        except QueueFull as exc:
            return refuse(endpoint, ProtocolError(None, f"the server is busy: {exc}; retry "
                                                  "later", 429, "rate_limit_error"))
        except NotAccepting as exc:
            return refuse(endpoint, ProtocolError(None, f"the server is not accepting "
                                                  f"requests ({exc})", 503, "unavailable"))
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
        if last.error is not None:
            metrics.requests.labels(endpoint, "500").inc()
            return JSONResponse(ProtocolError(None, last.error, 500, "server_error").body(),
                                500)
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
                                            "max_model_len": model.spec.max_positions}]}

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


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ProtocolError("body", f"the request body is not valid JSON: "
                            f"{str(exc)[:120]}") from None


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
        while not ended:
            delta = await job.events.get()
            ended = delta.finish_reason is not None
            if delta.error is not None:
                yield _sse(ProtocolError(None, delta.error, 500, "server_error").body())
                break
            # a completion chunk carries the step's token ids even when its text is held back
            # (a possible stop string, half a character, no tokenizer)
            if delta.text or ended or (delta.tokens and not shape.chat):
                yield _sse(shape.chunk(delta))
        if shape.request.include_usage:
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


def _usage(job: Job) -> dict[str, int]:
    return {"prompt_tokens": job.prompt_tokens, "completion_tokens": job.completion_tokens,
            "total_tokens": job.prompt_tokens + job.completion_tokens}
