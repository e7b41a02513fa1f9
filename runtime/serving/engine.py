"""The engine thread: the one owner of the Scheduler, fed through a thread-safe queue.

The Scheduler is not thread-safe, so exactly one thread touches it. HTTP handlers (on the
asyncio loop) `submit` a checked request and `cancel` one through `inbox`, a `queue.Queue`; the
thread takes every pending command, runs one batched step (the next token of every running
sequence plus prompt chunks of waiting ones, within the token budget), and sends each request
its `Delta` on its own asyncio queue with `loop.call_soon_threadsafe`. With nothing to do it
sleeps on the inbox. A cancelled request (a client gone, a drain's deadline) frees its blocks
at the next turn of the loop, before the next step.

Admission is counted under a lock on the caller's side, so a full queue is refused at once
(429): `reading` counts requests whose body is being read and checked (off the event loop: a
chat template, a tokenizer), `queued` those admitted and still waiting for their first token,
`active` those not yet ended. A drain waits for the ones being read too: a request that
arrived before SIGTERM is admitted when its checks end, until the drain's deadline `close`s the
engine. A sequence the model fails (NaN or +inf logits: an event with `error`) ends alone with
finish_reason "error"; the others of its step go on.

At most `max_num_seqs` requests are in the Scheduler at once (running or waiting for blocks);
the others wait here in arrival order and enter as those end (vLLM's `--max-num-seqs`): a KV
cache sized for that many full contexts (memory.py) then never preempts.

Before taking requests the thread allocates the KV cache and warms the model with a one-token
generation; `ready` is set after it (the health check answers 200 from then on, and requests
are read only from then on: their checks need the cache's size).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from compiler.heap import trim_heap

from ..generation.scheduler import Scheduler, Sequence, TokenEvent
from .metrics import Metrics
from .protocol import GenerationRequest
from .text import TextStream

log = logging.getLogger("dayzero.serve")


class QueueFull(Exception):
    """`max_queue` requests are already waiting for their first token."""


class NotAccepting(Exception):
    """The engine is warming up, draining, or failed to start."""


@dataclass
class Delta:
    """What one step added to a request: new text, new token ids, and how it ended (if so)."""
    text: str
    tokens: list[int]
    finish_reason: str | None = None  # stop, length, cancelled, error
    error: str | None = None


@dataclass(eq=False)
class Job:
    request: GenerationRequest
    sequence: Sequence
    text: TextStream
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    submitted: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    last_token: float | None = None
    queued: bool = True  # counted in Engine.queued until its first token

    @property
    def prompt_tokens(self) -> int:
        return self.sequence.prompt_len

    @property
    def completion_tokens(self) -> int:
        return len(self.sequence.generated)


class Engine:
    def __init__(self, model, metrics: Metrics, max_batch_tokens: int | None = None,
                 max_queue: int = 64, max_num_seqs: int | None = None):
        self.model = model
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_batch_tokens = max_batch_tokens
        self.max_num_seqs = max_num_seqs  # None: as many as the scheduler takes
        # admitted jobs not yet in the scheduler (max_num_seqs reached), by id(sequence)
        self.pending: OrderedDict[int, Job] = OrderedDict()
        self.scheduler: Scheduler | None = None  # made on the engine thread (the KV pool)
        self.inbox: queue.Queue = queue.Queue()
        self.jobs: dict[int, Job] = {}  # id(sequence) -> job; the engine thread's own
        self.lock = threading.Lock()  # guards reading, queued, active, draining, closed
        self.reading = 0
        self.queued = 0
        self.active = 0
        self.draining = False
        self.closed = False  # past the drain's deadline: nothing more is admitted
        self.ready = threading.Event()
        self.failure: str | None = None
        # told when the warm-up fails: a server that can never answer stops, with the reason
        self.on_failure: Callable[[str], None] | None = None
        self._preemptions = 0
        self._prefix = (0, 0)  # the allocator's prefix queries and hits already counted
        self._kv_peak = 0
        # deltas of this turn of the loop, by event loop: handed over in one call per loop
        self._outbox: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Delta]]] = {}
        self.thread = threading.Thread(target=self._run, name="dayzero-engine", daemon=True)

    # -- the callers' side (any thread) ------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def open_request(self) -> None:
        """A request is about to be read and checked: raises NotAccepting unless the engine
        takes requests; else counted in `reading` until `submit(..., opened=True)` or
        `close_request`."""
        with self.lock:
            if self.draining or not self.ready.is_set() or self.failure is not None:
                raise NotAccepting(self.state)
            self.reading += 1

    def close_request(self) -> None:
        """An opened request was refused while it was read."""
        with self.lock:
            self.reading -= 1

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop,
               opened: bool = False) -> Job:
        """Admit `request`, or raise QueueFull / NotAccepting. `opened`: it was counted by
        `open_request` (before a drain began), so a drain still admits it."""
        with self.lock:
            if opened:
                self.reading -= 1
            if (self.draining and not opened) or self.closed or not self.ready.is_set() \
                    or self.failure is not None:
                raise NotAccepting(self.state)
            if self.queued >= self.max_queue:
                raise QueueFull(f"{self.queued} requests are waiting for their first token "
                                f"(--max-queue {self.max_queue})")
            self.queued += 1
            self.active += 1
        sampling = request.sampling
        rng = np.random.default_rng([sampling.seed, 0]) if sampling.seed is not None else None
        # the request's logit processors and eos ids (protocol.py: its sampling fields over the
        # artifact's generation config), else the artifact's own, as `generate`
        processors = request.processors or getattr(self.model, "logit_processors", None)
        eos = self.model.spec.eos_token_ids if processors is None else processors.eos_token_ids
        sequence = Sequence(list(request.prompt_ids), request.max_tokens, sampling,
                            frozenset(int(t) for t in eos), rng, images=request.images,
                            processors=processors)
        text = TextStream(self.model.tokenizer, request.stop, request.min_tokens)
        job = Job(request, sequence, text, loop)
        self.metrics.prompt_tokens.inc(len(request.prompt_ids))
        self.inbox.put(("add", job))
        return job

    def cancel(self, job: Job) -> None:
        """End `job` now (its client went away); its blocks are freed before the next step."""
        self.inbox.put(("cancel", job))

    def cancel_all(self) -> None:
        self.inbox.put(("cancel_all", None))

    def begin_drain(self) -> None:
        with self.lock:
            self.draining = True

    def close(self) -> None:
        """The drain's deadline: admit nothing more, not even requests read before it."""
        with self.lock:
            self.draining = self.closed = True

    def wait_idle(self, timeout: float) -> bool:
        """Whether every request read or admitted ended within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.active == 0 and self.reading == 0:
                return True
            time.sleep(0.02)
        return self.active == 0 and self.reading == 0

    def stop(self, timeout: float = 10.0) -> None:
        self.inbox.put(("stop", None))
        if self.thread.is_alive():
            self.thread.join(timeout)

    @property
    def state(self) -> str:
        if self.failure is not None:
            return "failed"
        if self.draining:
            return "draining"
        return "ok" if self.ready.is_set() else "loading"

    # -- the engine thread -------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._warm_up()
        except Exception as exc:  # the health check says so; nothing is admitted
            self.failure = f"{type(exc).__name__}: {exc}"
            log.exception("the model failed its warm-up generation")
            if self.on_failure is not None:
                self.on_failure(f"the model failed its warm-up generation: {self.failure}")
            return
        self.ready.set()
        clock = _PhaseClock(self.metrics.engine_seconds)
        while True:
            idle = self.scheduler.idle and not self.pending
            running = self._take_commands(block=idle)
            clock.lap("idle" if idle else "commands")
            if not running:
                break
            self._admit()
            if self.scheduler.idle:
                self._flush()
                continue
            try:
                events = self.scheduler.step()
                clock.lap("step")
                now = time.perf_counter()
                for event in events:
                    self._emit(event, now)
            except Exception as exc:  # a backend failure ends the requests it was serving
                log.exception("a generation step failed")
                self._end_all("error", f"the generation step failed: {type(exc).__name__}: "
                              f"{exc}")
            self._flush()
            self._gauges()
            if self.scheduler.idle:  # the load has passed: hand freed heap pages back
                trim_heap()
            clock.lap("stream")
        self._flush()

    def _warm_up(self) -> None:
        spec = self.model.spec
        self.scheduler = Scheduler(self.model.runner, self.max_batch_tokens,
                                   prefix_cache=getattr(self.model, "prefix_cache", True))
        bos = (self.model.tokenizer.tokenizer.token_to_id(self.model.tokenizer.bos_token)
               if self.model.tokenizer is not None and self.model.tokenizer.bos_token else None)
        token = bos if bos is not None else 0
        # one token, then one step as large as the token budget allows: the model's buffers
        # (ONNX Runtime's arena) reach their largest now, not under the first heavy load
        for batch in ([Sequence([token], 1)], self._full_step(token)):
            for warm in batch:
                self.scheduler.add(warm)
            for _ in self.scheduler.run():
                pass
        # the pool's pages are taken now, not as load first reaches them: the server's memory
        # after start-up is what it keeps under any load
        self.model.runner.commit_cache()
        trim_heap()
        self.scheduler.on_step = self._count_step
        if getattr(self.model, "vision", None) is not None:
            _ = self.model.vision.model  # the vision encoder, loaded before /health says ok
        log.info("warmed up: vocabulary %d, context %d, KV cache %d blocks", spec.vocab_size,
                 spec.max_positions, self.scheduler.allocator.num_blocks)
        allocator = self.scheduler.allocator  # the warm-up's prompts are not the clients'
        self._prefix = (allocator.prefix_queries, allocator.prefix_hits)
        self._gauges()

    def _full_step(self, token: int) -> list[Sequence]:
        """Prompts that fill one step's token budget: chunk-long ones (within the context and
        the KV pool), each answered with one token."""
        scheduler = self.scheduler
        pool = scheduler.allocator.num_blocks * scheduler.allocator.block_size
        length = max(1, min(scheduler.chunk, self.model.spec.max_positions - 1, pool - 1))
        fit = scheduler.allocator.num_blocks // scheduler.allocator.blocks_needed(length)
        count = max(1, min(-(-scheduler.budget // length), fit))
        return [Sequence([token] * length, 1) for _ in range(count)]

    def _take_commands(self, block: bool) -> bool:
        """Apply every pending command (waiting for one when `block`); False on stop."""
        try:
            command = self.inbox.get() if block else self.inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            kind, job = command
            if kind == "stop":
                self._end_all("cancelled")
                return False
            if kind == "add":
                self.jobs[id(job.sequence)] = job
                self.pending[id(job.sequence)] = job
            elif kind == "cancel" and id(job.sequence) in self.jobs:
                if self.pending.pop(id(job.sequence), None) is None:
                    self.scheduler.cancel(job.sequence)
                else:
                    job.sequence.finish_reason = "cancelled"
                self._end(job, Delta("", [], "cancelled"))
            elif kind == "cancel_all":
                self._end_all("cancelled")
            try:
                command = self.inbox.get_nowait()
            except queue.Empty:
                self._gauges()
                return True

    def _admit(self) -> None:
        """Hand the pending jobs to the scheduler, oldest first, up to `max_num_seqs` there."""
        scheduler, cap = self.scheduler, self.max_num_seqs
        while self.pending and (cap is None
                                or len(scheduler.running) + len(scheduler.waiting) < cap):
            _, job = self.pending.popitem(last=False)
            scheduler.add(job.sequence)

    def _emit(self, event: TokenEvent, now: float) -> None:
        job = self.jobs.get(id(event.sequence))
        if job is None:  # the warm-up sequence
            return
        sequence = event.sequence
        error = getattr(event, "error", None)
        if error is not None:  # the model gave this sequence NaN or +inf logits: it ends here
            if not sequence.finished:
                self.scheduler.cancel(sequence)
            self._end(job, Delta(job.text.flush(), [], "error", error))
            return
        self.metrics.generated_tokens.inc()
        if job.first_token is None:
            job.first_token = now
            self.metrics.ttft.observe(now - job.submitted)
            self._unqueue(job)
        job.last_token = now
        text = job.text.push(event.token)
        if job.text.stopped:
            if not sequence.finished:
                sequence.finish_reason = "stop"
                self.scheduler.cancel(sequence)  # keeps the reason it finds
            self._end(job, Delta(text, [event.token], "stop"))
        elif sequence.finished:
            self._end(job, Delta(text + job.text.flush(), [event.token],
                                 sequence.finish_reason))
        else:
            self._send(job, Delta(text, [event.token]))

    def _end(self, job: Job, delta: Delta) -> None:
        self.jobs.pop(id(job.sequence), None)
        self._send(job, delta)
        self.metrics.finished.labels(delta.finish_reason).inc()
        if job.first_token is not None and job.completion_tokens > 1:
            self.metrics.tpot.observe((job.last_token - job.first_token)
                                      / (job.completion_tokens - 1))
        self._unqueue(job)
        with self.lock:
            self.active -= 1

    def _end_all(self, reason: str, error: str | None = None) -> None:
        for job in list(self.jobs.values()):
            if self.pending.pop(id(job.sequence), None) is not None:
                job.sequence.finish_reason = reason
            elif not job.sequence.finished:
                self.scheduler.cancel(job.sequence)
            self._end(job, Delta("", [], reason, error))
        self._gauges()

    def _unqueue(self, job: Job) -> None:
        if job.queued:
            job.queued = False
            with self.lock:
                self.queued -= 1

    def _send(self, job: Job, delta: Delta) -> None:
        self._outbox.setdefault(job.loop, []).append((job.events, delta))

    def _flush(self) -> None:
        """Hand this turn's deltas to their event loops: one wake-up per loop and step, not
        one per token (each is a write to the loop's self-pipe and a turn of that loop)."""
        outbox, self._outbox = self._outbox, {}
        for loop, deltas in outbox.items():
            try:
                loop.call_soon_threadsafe(_deliver, deltas)
            except RuntimeError:  # the event loop has closed: nobody is listening
                pass

    def _count_step(self, tokens: int, sequences: int) -> None:
        self.metrics.steps.inc()
        self.metrics.step_tokens.inc(tokens)
        self.metrics.step_sequences.inc(sequences)
        used = self.scheduler.allocator.used  # before the step's finished sequences free theirs
        if used > self._kv_peak:
            self._kv_peak = used
            self.metrics.kv_peak.set(used)

    def _gauges(self) -> None:
        m, scheduler = self.metrics, self.scheduler
        m.queue_depth.set(self.queued)
        m.running.set(len(scheduler.running))
        m.kv_used.set(scheduler.allocator.used)
        m.kv_free.set(scheduler.allocator.num_blocks - scheduler.allocator.used)
        if scheduler.preemptions > self._preemptions:
            m.preemptions.inc(scheduler.preemptions - self._preemptions)
            self._preemptions = scheduler.preemptions
        allocator = scheduler.allocator
        m.prefix_queries.inc(allocator.prefix_queries - self._prefix[0])
        m.prefix_hits.inc(allocator.prefix_hits - self._prefix[1])
        self._prefix = (allocator.prefix_queries, allocator.prefix_hits)
        m.kv_cached.set(allocator.cached_blocks)


def _deliver(deltas: list[tuple[asyncio.Queue, Delta]]) -> None:
    for events, delta in deltas:
        events.put_nowait(delta)


class _PhaseClock:
    """Adds the engine thread's time to `counter` by phase: `step` (planning, the model,
    sampling), `stream` (detokenizing and handing tokens to the requests), `commands`
    (admissions and cancellations) and `idle` (waiting for a request)."""

    def __init__(self, counter):
        self.counter = counter
        self.last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.counter.labels(phase).inc(now - self.last)
        self.last = now
