"""The server's app on a real uvicorn, in this process, on a free port of 127.0.0.1: for tests
that hold a request inside the server (a tokenizer double waiting on an Event) or set limits a
subprocess would need flags for. `GatedTokenizer` is that double: the artifact's own tokenizer,
except that a text holding GATE_MARK spins in Python (the GIL held but for the interpreter's
switches) until the test opens the gate."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Any

GATE_MARK = "SLOW"


class GatedTokenizer:
    def __init__(self, tokenizer):
        self.inner = tokenizer
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.calls = 0

    def __getattr__(self, name: str) -> Any:  # chat_template, bos_token, the library's object
        return getattr(self.inner, name)

    def _hold(self, text: str) -> None:
        self.calls += 1
        if GATE_MARK not in text:
            return
        self.entered.set()
        deadline = time.monotonic() + 60
        while not self.gate.is_set() and time.monotonic() < deadline:
            sum(range(20000))  # pure Python: what a chat template's loops do

    def encode(self, text: str) -> list[int]:
        self._hold(text)
        return self.inner.encode(text)

    def chat_ids(self, messages) -> list[int]:
        self._hold(json.dumps(messages))
        return self.inner.chat_ids(messages)


class WithTokenizer:
    """`model` with another tokenizer; everything else is the model's own."""

    def __init__(self, model, tokenizer):
        self._model = model
        self.tokenizer = tokenizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class InProcessServer:
    def __init__(self, model, name: str = "lm.dz", **app_options: Any):
        import uvicorn

        from runtime.serving.app import create_app
        from runtime.serving.engine import Engine
        from runtime.serving.metrics import Metrics
        from runtime.serving.workers import Workers

        self.metrics = Metrics()
        self.engine = Engine(model, self.metrics)
        self.workers = Workers(4)
        app = create_app(model, name, self.engine, self.metrics, self.workers, **app_options)
        self.engine.start()
        assert self.engine.ready.wait(60), self.engine.failure
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn never started"
            time.sleep(0.01)

    def request(self, method: str, path: str, body: bytes | dict | None = None,
                headers: dict[str, str] | None = None,
                timeout: float = 30) -> tuple[int, Any]:
        """Status and decoded JSON (text if not JSON); status 0 if no answer came."""
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request(method, path, body=data, headers={
                "Content-Type": "application/json", **(headers or {})})
            response = connection.getresponse()
            status, text = response.status, response.read().decode()
        except OSError:
            return 0, ""
        finally:
            connection.close()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.engine.stop()
        self.sock.close()
