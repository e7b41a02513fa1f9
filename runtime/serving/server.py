"""Running the server: uvicorn on one event loop, the engine on its own thread, and a drain.

Once the port is open and the model warm, one line goes to stdout, whatever the log level:
`ready: http://HOST:PORT, model NAME, KV cache N tokens`.

SIGTERM (or Ctrl-C) starts a drain instead of uvicorn's immediate stop: the engine admits
nothing new and /health answers 503, the requests in flight (those being read and checked
too: a chat template rendering, a prompt being tokenized) run to their end for up to
`drain_timeout` seconds, then whatever is left is cancelled (its blocks freed, its streams
closed) and the requests still being read are answered 503 (their worker threads are daemons
and are not waited for), uvicorn shuts down and the process exits 0. A second signal stops at
once.

A tensor-parallel model (runtime/generation/ranks.py) reports a rank that died: /health
answers 503 with the error at once, every request ends with it, and after `FAIL_EXIT_S` the
server stops and `serve` raises the error naming the rank (the command exits 1).
"""

from __future__ import annotations

import logging
import threading
from contextlib import asynccontextmanager

import uvicorn

from compiler.errors import DayzeroError

from .app import create_app
from .engine import Engine, NotAccepting
from .limits import BODY_TIMEOUT_S
from .metrics import Metrics
from .workers import Workers

log = logging.getLogger("dayzero.serve")
FAIL_EXIT_S = 1.0  # a failed model's 503s are seen this long before the server stops


def serve(model, model_name: str, host: str = "127.0.0.1", port: int = 8000,
          max_batch_tokens: int | None = None, max_queue: int = 64,
          drain_timeout: float = 30.0, log_level: str = "info",
          body_timeout: float = BODY_TIMEOUT_S, max_model_len: int | None = None,
          max_num_seqs: int | None = None) -> int:
    """Serve `model` (a GenerationModel) until a signal drains it; the exit status.
    `max_model_len`: the context served (None: the artifact's); `max_num_seqs`: sequences
    generated at once (None: no bound but the scheduler's)."""
    metrics = Metrics()
    engine = Engine(model, metrics, max_batch_tokens, max_queue, max_num_seqs)
    workers = Workers()
    app = create_app(model, model_name, engine, metrics, workers, body_timeout=body_timeout,
                     max_model_len=max_model_len)

    @asynccontextmanager
    async def lifespan(_app):
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    app.router.lifespan_context = lifespan
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=5)
    server = _DrainingServer(config, engine, workers, drain_timeout, model_name)
    _log_like_uvicorn(log_level)
    engine.on_failure = server.fail
    on_failure = getattr(model, "on_failure", None)
    if on_failure is not None:
        on_failure(server.fail)
    try:
        server.run()
    finally:
        close = getattr(model, "close", None)
        if close is not None:
            close()
    if server.failure is not None:
        raise DayzeroError(server.failure, f"dayzero serve of {model_name}",
                           "the log above says why (a rank that died: killed, out of memory; a "
                           "model that cannot run its warm-up); fix that and start the server "
                           "again")
    return 0 if server.started else 1


def _log_like_uvicorn(level: str) -> None:
    """The server's own messages (warm-up, drain) on uvicorn's handlers (set up by its Config)."""
    log.setLevel(level.upper())
    if not log.handlers:
        for handler in logging.getLogger("uvicorn").handlers:
            log.addHandler(handler)
        log.propagate = not log.handlers


class _DrainingServer(uvicorn.Server):
    def __init__(self, config, engine: Engine, workers: Workers, drain_timeout: float,
                 model_name: str = ""):
        super().__init__(config)
        self.engine = engine
        self.workers = workers
        self.drain_timeout = drain_timeout
        self.model_name = model_name
        self._draining = False
        self.failure: str | None = None

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:  # the port is open; the line comes once the model is warm too
            threading.Thread(target=self._announce, name="dayzero-ready", daemon=True).start()

    def _announce(self) -> None:
        """Print the one line that says the server answers (/health 200 from now on)."""
        while not self.engine.ready.wait(0.05):
            if self.engine.failure is not None or self.should_exit:
                return
        if self.engine.failure is not None or self._draining:
            return
        host, port = self.config.host, self.config.port
        bound = [s.getsockname() for server in self.servers for s in (server.sockets or ())]
        if bound:
            port = bound[0][1]
        allocator = self.engine.scheduler.allocator
        tokens = allocator.num_blocks * allocator.block_size
        print(f"ready: http://{host}:{port}, model {self.model_name}, KV cache {tokens} "
              "tokens", flush=True)

    def fail(self, message: str) -> None:
        """A rank died or the warm-up failed (any thread): unhealthy now, end every request,
        stop shortly."""
        self.failure = message
        self.engine.failure = message
        self.engine.begin_drain()
        self.engine.cancel_all()
        self.workers.abandon(lambda: NotAccepting("failed"))
        log.error("%s; stopping the server", message)
        timer = threading.Timer(FAIL_EXIT_S, self._stop_now)
        timer.daemon = True
        timer.start()

    def _stop_now(self) -> None:
        self.should_exit = True

    def handle_exit(self, sig, frame) -> None:
        # uvicorn's own handler stops at once and re-raises the signal after shutdown (the
        # process would die of SIGTERM, not exit 0); this one drains first.
        if self._draining:
            self.should_exit = self.force_exit = True
            return
        self._draining = True
        self.engine.begin_drain()
        log.info("draining: finishing %d request(s) for up to %.0f s",
                 self.engine.active + self.engine.reading, self.drain_timeout)
        threading.Thread(target=self._drain, name="dayzero-drain", daemon=True).start()

    def _drain(self) -> None:
        if not self.engine.wait_idle(self.drain_timeout):
            log.warning("drain timeout: cancelling %d request(s)",
                        self.engine.active + self.engine.reading)
            self.engine.close()
            self.engine.cancel_all()
            self.workers.abandon(lambda: NotAccepting("draining"))
            self.engine.wait_idle(2.0)
        self.should_exit = True
