"""`dayzero serve` under load: throughput, TTFT and time per output token, and a soak.

The random ~150M-parameter Llama checkpoint of benchmarks/generate.py (`make_checkpoint`, with
its tokenizer) is compiled once into --workdir (`build_dayzero`, positions --max-positions),
then served by `dayzero serve ART --port P` in a subprocess on a free port of 127.0.0.1 (its
log goes to --workdir/serve-P.log). Nothing else is contacted.

The load is a seeded mix of token-id prompts (mostly short chats of 16-128 tokens, a few long
documents of 1000-2000), greedy, with max_tokens drawn from --max-tokens, sent as streamed
/v1/completions by --concurrency closed-loop clients (each sends its next request when its last
ended), so that the time to first token (TTFT) and the time per output token after it (TPOT, a
request's mean gap, as the server's own histogram defines it) are taken client-side. Per
concurrency it prints the requests, errors by status (429: the queue was full, as designed;
`stream`: an error inside a 200 stream; `transport`: the connection failed), generated tokens
per second over the wall time, TTFT and TPOT p50/p99, and how many greedy answers differ from
the same request generated alone. Then the same requests one at a time in-process
(`runtime.load(ART).stream`) give the single-request tokens/s and decode time per token, and
two verdicts: concurrency-8 throughput >= 4x single, and concurrency-8 TPOT p50 <= 2x single.

--soak SECONDS runs mixed load (with --cancel-fraction of the streams closed early, some before
their first token) for that long after a warm-up pass, then checks through /metrics that every
KV block is free, that the server's RSS (/proc/PID/status VmRSS) is within 5% of its value after
the warm-up, and that every completed answer equals the same request served alone.

--compare-static runs transformers' and ONNX Runtime GenAI's static batches of 8 (left-padded
batch generate) over the same requests: useful tokens (each row up to its own max_tokens or
EOS) per second, beside continuous batching's. A peer that cannot load or build is skipped.

    python benchmarks/serve.py                                   # c=1,8,32, 64 requests
    python benchmarks/serve.py --requests 24 --concurrency 1,8
    python benchmarks/serve.py --soak 600                        # the issue's 10-minute soak
    python benchmarks/serve.py --compare-static --requests 32

The server and this client share the machine's cores (the client parses every streamed chunk).
The bookkeeping is tested in tests/benchmarks/test_serve_harness.py; figures belong in
docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
THREADS = 2
VOCAB = 32000
FIRST_ID = 3  # ids 0-2 are <unk>, <s>, </s>
EOS = 2


def _generate_bench():
    """benchmarks/generate.py (the checkpoint and the dayzero/GenAI builds), loaded by path."""
    name = "dayzero_bench_generate"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("generate.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# -- the request mix -------------------------------------------------------------------------
@dataclass(frozen=True)
class Req:
    index: int
    prompt: tuple[int, ...]
    max_tokens: int


def request_mix(n: int, seed: int, max_positions: int, max_tokens: tuple[int, int] = (32, 256),
                short: tuple[int, int] = (16, 128), long: tuple[int, int] = (1000, 2000),
                long_fraction: float = 0.1, vocab: int = VOCAB) -> list[Req]:
    """`n` requests, reproducible from `seed`: round(n * long_fraction) long documents at
    random places, the rest short chats; prompt lengths and max_tokens uniform in their
    (inclusive) ranges, every prompt + max_tokens within `max_positions`."""
    rng = random.Random(seed)
    top = max_positions - max_tokens[1]
    if top < short[0]:
        raise ValueError(f"--max-positions {max_positions} leaves no room for a "
                         f"{short[0]}-token prompt and {max_tokens[1]} new tokens")
    longs = set(rng.sample(range(n), round(n * long_fraction)))
    requests = []
    for i in range(n):
        low, high = long if i in longs else short
        length = rng.randint(min(low, top), min(high, top))
        prompt = tuple(rng.randrange(FIRST_ID, vocab) for _ in range(length))
        requests.append(Req(i, prompt, rng.randint(*max_tokens)))
    return requests


# -- statistics ------------------------------------------------------------------------------
def percentile(values, q: float) -> float:
    """The q-th percentile with linear interpolation between order statistics (numpy's
    default); nan for no values."""
    data = sorted(values)
    if not data:
        return math.nan
    rank = (len(data) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (rank - low)


@dataclass
class Outcome:
    """One request as the client saw it."""
    index: int
    status: int = 0          # HTTP status; 0: no response (transport error)
    prompt_tokens: int = 0
    start: float = 0.0
    stamps: list[float] = field(default_factory=list)  # arrival time of each token id
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    usage_tokens: int | None = None  # completion_tokens of the usage chunk
    error: str | None = None
    cancelled: bool = False  # closed early by the client, on purpose

    @property
    def completed(self) -> bool:
        return (self.status == 200 and self.error is None and not self.cancelled
                and self.finish_reason is not None)

    @property
    def ttft(self) -> float | None:
        return self.stamps[0] - self.start if self.stamps else None

    @property
    def tpot(self) -> float | None:
        """Mean gap between tokens after the first (the server's TPOT definition)."""
        if len(self.stamps) < 2:
            return None
        return (self.stamps[-1] - self.stamps[0]) / (len(self.stamps) - 1)

    @property
    def lost_ids(self) -> bool:
        """The usage chunk counts more tokens than the stream carried ids for."""
        return self.usage_tokens is not None and self.usage_tokens != len(self.tokens)


def error_kind(o: Outcome) -> str | None:
    """None for a request that went through (or was closed by us on purpose), else its
    status code, `stream` (an error event in a 200 stream) or `transport`."""
    if o.status == 0:
        return "transport"
    if o.status != 200:
        return str(o.status)
    if o.error is not None:
        return "stream"
    if not o.cancelled and o.finish_reason is None:
        return "unfinished"  # the stream ended without a finish_reason
    return None


@dataclass
class Summary:
    requests: int
    completed: int
    cancelled: int
    busy: int                # 429s: the server's queue was full (backpressure, by design)
    errors: dict[str, int]   # the other failures, by error_kind
    tokens: int
    tokens_per_s: float
    prompt_tokens_per_s: float  # of the requests answered (not 429, not failed to connect)
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    lost_ids: int


def summarize(outcomes: list[Outcome], wall: float) -> Summary:
    """Figures of one load run (times in seconds; tokens/s over `wall`)."""
    errors = Counter(k for k in map(error_kind, outcomes) if k is not None)
    busy = errors.pop("429", 0)
    tokens = sum(len(o.tokens) for o in outcomes)
    ttfts = [o.ttft for o in outcomes if o.ttft is not None and o.status == 200]
    tpots = [o.tpot for o in outcomes if o.tpot is not None and o.completed]
    return Summary(len(outcomes), sum(o.completed for o in outcomes),
                   sum(o.cancelled for o in outcomes), busy, dict(sorted(errors.items())),
                   tokens,
                   tokens / wall if wall > 0 else math.nan,
                   sum(o.prompt_tokens for o in outcomes if o.status == 200) / wall
                   if wall > 0 else math.nan, percentile(ttfts, 50),
                   percentile(ttfts, 99), percentile(tpots, 50), percentile(tpots, 99),
                   sum(o.lost_ids for o in outcomes))


def summary_line(label: str, s: Summary) -> str:
    errors = ", ".join(f"{k}: {v}" for k, v in s.errors.items()) or "none"
    line = (f"  {label:<8}{s.requests:>4} req {s.completed:>4} ok  429s {s.busy}  errors "
            f"{errors:<6}{s.tokens_per_s:>8.1f} tok/s  TTFT p50 {s.ttft_p50 * 1e3:7.0f} p99 "
            f"{s.ttft_p99 * 1e3:7.0f} ms  TPOT p50 {s.tpot_p50 * 1e3:6.1f} p99 "
            f"{s.tpot_p99 * 1e3:6.1f} ms  (prompts {s.prompt_tokens_per_s:.0f} tok/s)")
    if s.cancelled:
        line += f"  cancelled {s.cancelled}"
    if s.lost_ids:
        line += f"  STREAMS MISSING TOKEN IDS {s.lost_ids}"
    return line


def verdicts(c8_tokens_per_s: float, single_tokens_per_s: float, c8_tpot_p50: float,
             single_tpot: float) -> list[str]:
    """The two targets of continuous batching at concurrency 8 against one request at a time:
    throughput >= 4x, TPOT p50 <= 2x the single-request decode time per token."""
    gain = c8_tokens_per_s / single_tokens_per_s
    slow = c8_tpot_p50 / single_tpot
    return [f"  throughput c=8 {c8_tokens_per_s:.1f} tok/s = {gain:.2f}x single "
            f"({single_tokens_per_s:.1f} tok/s); target >= 4x: "
            f"{'met' if gain >= 4 else 'MISSED'}",
            f"  TPOT p50 c=8 {c8_tpot_p50 * 1e3:.1f} ms = {slow:.2f}x single decode "
            f"({single_tpot * 1e3:.1f} ms/token); target <= 2x: "
            f"{'met' if slow <= 2 else 'MISSED'}"]


def first_divergence(a, b) -> int | None:
    """The first position where two token lists differ (a length difference counts); None when
    they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def mismatches(outcomes: list[Outcome], reference: dict[int, list[int]]
               ) -> list[tuple[int, int]]:
    """(request index, first differing position) of each completed outcome whose tokens are
    not its request's tokens generated alone."""
    found = []
    for o in outcomes:
        if o.completed and o.index in reference:
            at = first_divergence(o.tokens, reference[o.index])
            if at is not None:
                found.append((o.index, at))
    return found


_SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text exposition -> {(name, sorted label pairs): value}."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        pairs = tuple(sorted(_LABEL.findall(labels or "")))
        samples[(name, pairs)] = float(value)
    return samples


def metric(samples, name: str, **labels) -> float:
    """The value of one sample; the sum over samples of `name` matching `labels` (0 if none)."""
    want = set(labels.items())
    return sum(v for (n, pairs), v in samples.items() if n == name and want <= set(pairs))


PHASES = ("step", "stream", "commands", "idle")


def engine_line(before: dict, after: dict, wall: float) -> str:
    """Where the server's engine thread spent a run (two /metrics samples around it): its
    steps, their mean batch and tokens, and the share of `wall` in each phase."""
    def delta(name: str, **labels) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    steps = delta("dayzero_steps_total")
    if steps == 0:
        return "  engine: no steps"
    shares = ", ".join(f"{phase} {delta('dayzero_engine_seconds_total', phase=phase) / wall:.0%}"
                       for phase in PHASES)
    step_s = delta("dayzero_engine_seconds_total", phase="step")
    return (f"  engine: {steps:.0f} steps of {delta('dayzero_step_sequences_total') / steps:.1f} "
            f"sequences and {delta('dayzero_step_tokens_total') / steps:.0f} tokens, "
            f"{step_s / steps * 1e3:.1f} ms each; of the wall time: {shares}")


def rss_verdict(before: int, after: int, tolerance: float = 0.05) -> str:
    change = (after - before) / before
    verdict = "met" if abs(change) <= tolerance else "MISSED"
    return (f"  server RSS {before / 2**20:.0f} MiB after warm-up -> {after / 2**20:.0f} MiB "
            f"after the soak ({change:+.1%}); target within {tolerance:.0%}: {verdict}")


def vm_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


# -- the server ------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _httpx():
    try:
        import httpx
    except ImportError:  # the openai client's own fork
        import httpx2 as httpx
    return httpx


class Server:
    """`dayzero serve ART` on a free port of 127.0.0.1, as a subprocess."""

    def __init__(self, artifact: Path, workdir: Path, extra: list[str], startup_s: float):
        self.port = free_port()
        self.base = f"http://{HOST}:{self.port}"
        self.log_path = workdir / f"serve-{self.port}.log"
        self.model_name = "bench"
        command = [sys.executable, "-m", "compiler.cli", "serve", str(artifact), "--host", HOST,
                   "--port", str(self.port), "--model-name", self.model_name,
                   "--log-level", "warning", *extra]
        env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), PYTHONPATH=str(ROOT))
        self.log = open(self.log_path, "wb")
        started = time.perf_counter()
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=self.log,
                                        stderr=subprocess.STDOUT)
        self.http = _httpx().Client(base_url=self.base, timeout=30, trust_env=False)
        self._wait_healthy(startup_s)
        self.healthy_s = time.perf_counter() - started  # process start to /health 200

    @property
    def pid(self) -> int:
        return self.process.pid

    def _wait_healthy(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dayzero serve exited with {self.process.returncode}:\n"
                                   f"{self.log_tail()}")
            try:
                if self.http.get("/health").status_code == 200:
                    return
            except Exception:  # not listening yet
                pass
            time.sleep(0.02)  # fine enough to time the start-up
        raise RuntimeError(f"dayzero serve not healthy after {seconds:.0f} s:\n"
                           f"{self.log_tail()}")

    def metrics(self) -> dict:
        return parse_metrics(self.http.get("/metrics").text)

    def wait_idle(self, seconds: float = 30.0) -> dict:
        """/metrics once nothing runs or waits (or after `seconds`)."""
        deadline = time.monotonic() + seconds
        while True:
            samples = self.metrics()
            idle = (metric(samples, "dayzero_running_sequences") == 0
                    and metric(samples, "dayzero_queue_depth") == 0)
            if idle or time.monotonic() > deadline:
                return samples
            time.sleep(0.2)

    def alone(self, req: Req) -> list[int]:
        """The request's greedy token ids, served by itself (a whole answer)."""
        answer = self.http.post("/v1/completions", json=_body(self.model_name, req, False),
                                timeout=600)
        answer.raise_for_status()
        return answer.json()["choices"][0]["token_ids"]

    def log_tail(self, lines: int = 30) -> str:
        self.log.flush()
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, drain_s: float = 30.0) -> int | None:
        self.http.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(drain_s + 15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        return self.process.returncode


# -- the client ------------------------------------------------------------------------------
def _body(model: str, req: Req, stream: bool) -> dict:
    body = {"model": model, "prompt": list(req.prompt), "max_tokens": req.max_tokens,
            "temperature": 0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def stream_one(client, model: str, req: Req, cancel_after: int | None = None) -> Outcome:
    """One streamed completion; `cancel_after` tokens (0: before the first) closes it early."""
    out = Outcome(req.index, prompt_tokens=len(req.prompt), start=time.perf_counter())
    try:
        async with client.stream("POST", "/v1/completions", json=_body(model, req, True)) as r:
            out.status = r.status_code
            if r.status_code != 200:
                await r.aread()
                return out
            if cancel_after == 0:
                out.cancelled = True
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    out.error = str(chunk["error"].get("message"))[:200]
                    continue
                if chunk.get("usage"):
                    out.usage_tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices") or []:
                    ids = choice.get("token_ids") or []
                    now = time.perf_counter()
                    out.stamps.extend([now] * len(ids))
                    out.tokens.extend(ids)
                    out.finish_reason = choice.get("finish_reason") or out.finish_reason
                if cancel_after and len(out.tokens) >= cancel_after \
                        and out.finish_reason is None:
                    out.cancelled = True
                    return out  # leaving the block closes the connection mid-stream
    except Exception as exc:  # noqa: BLE001 - a failed request is a result, not a crash
        out.error = f"{type(exc).__name__}: {exc}"[:200]
    return out


def _client(base: str, concurrency: int, timeout_s: float):
    httpx = _httpx()
    return httpx.AsyncClient(base_url=base, trust_env=False,
                             timeout=httpx.Timeout(timeout_s, connect=30),
                             limits=httpx.Limits(max_connections=concurrency + 8,
                                                 max_keepalive_connections=concurrency + 8))


async def run_load(base: str, model: str, requests: list[Req], concurrency: int,
                   timeout_s: float) -> tuple[list[Outcome], float, bool]:
    """`requests` in order through `concurrency` closed-loop clients: (outcomes, wall seconds,
    whether the run hit `timeout_s` and was cut)."""
    pending = iter(requests)
    outcomes: list[Outcome] = []

    async def client_loop(client):
        for req in pending:
            outcomes.append(await stream_one(client, model, req))

    async with _client(base, concurrency, timeout_s) as client:
        start = time.perf_counter()
        tasks = [asyncio.create_task(client_loop(client)) for _ in range(concurrency)]
        _, late = await asyncio.wait(tasks, timeout=timeout_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        wall = time.perf_counter() - start
    return outcomes, wall, bool(late)


async def run_soak(base: str, model: str, pool: list[Req], concurrency: int, seconds: float,
                   cancel_fraction: float, seed: int, timeout_s: float
                   ) -> tuple[list[Outcome], float]:
    """Requests drawn from `pool` by `concurrency` clients until `seconds` have passed, a
    `cancel_fraction` of them closed early after a random number of tokens (0: before the
    first); the requests under way at the deadline run to their end."""
    rng = random.Random(seed)
    outcomes: list[Outcome] = []
    deadline = time.perf_counter() + seconds

    async def client_loop(client):
        while time.perf_counter() < deadline:
            req = pool[rng.randrange(len(pool))]
            cancel = rng.randrange(req.max_tokens) if rng.random() < cancel_fraction else None
            outcomes.append(await stream_one(client, model, req, cancel))

    async with _client(base, concurrency, timeout_s) as client:
        start = time.perf_counter()
        tasks = [asyncio.create_task(client_loop(client)) for _ in range(concurrency)]
        _, late = await asyncio.wait(tasks, timeout=seconds + timeout_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        wall = time.perf_counter() - start
    return outcomes, wall


# -- one request at a time, in-process ---------------------------------------------------------
@dataclass
class Single:
    tokens_per_s: float       # generated tokens / time, prompt processing included
    decode_s: float           # median per-request time per token after the first
    reference: dict[int, list[int]]


def single_requests(artifact: Path, requests: list[Req]) -> Single:
    import runtime

    model = runtime.load(str(artifact), session={"intra_op_threads": THREADS,
                                                 "allow_spinning": True})
    for _ in model.stream([list(requests[0].prompt)], max_new_tokens=4):  # warm up
        pass
    reference, gaps, total_tokens, total_s = {}, [], 0, 0.0
    for req in requests:
        stamps, tokens = [], []
        start = time.perf_counter()
        for token in model.stream(list(req.prompt), max_new_tokens=req.max_tokens):
            stamps.append(time.perf_counter())
            tokens.append(int(token))
        total_s += time.perf_counter() - start
        total_tokens += len(tokens)
        reference[req.index] = tokens
        if len(stamps) > 1:
            gaps.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))
    return Single(total_tokens / total_s, percentile(gaps, 50), reference)


# -- static batches: transformers and ONNX Runtime GenAI ---------------------------------------
def pad_left(prompts: list[tuple[int, ...]], pad: int) -> tuple[list[list[int]], list[list[int]]]:
    """Left-padded ids and their attention mask."""
    width = max(len(p) for p in prompts)
    ids = [[pad] * (width - len(p)) + list(p) for p in prompts]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
    return ids, mask


def useful_tokens(new: list[int], max_tokens: int, eos: int = EOS) -> int:
    """Tokens a static batch generated that its row asked for: up to its own max_tokens, and
    up to and including its first EOS."""
    new = list(new[:max_tokens])
    return new.index(eos) + 1 if eos in new else len(new)


def batches(requests: list[Req], size: int) -> list[list[Req]]:
    return [requests[i:i + size] for i in range(0, len(requests), size)]


def static_transformers(folder: Path, requests: list[Req], size: int) -> float:
    import torch
    from transformers import LlamaForCausalLM

    torch.set_num_threads(THREADS)
    model = LlamaForCausalLM.from_pretrained(str(folder)).eval()
    useful, seconds = 0, 0.0
    with torch.no_grad():
        model.generate(torch.tensor([list(requests[0].prompt[:16])]), max_new_tokens=2,
                       do_sample=False, pad_token_id=0)  # warm up
        for group in batches(requests, size):
            ids, mask = pad_left([r.prompt for r in group], 0)
            ids_t, mask_t = torch.tensor(ids), torch.tensor(mask)
            start = time.perf_counter()
            out = model.generate(ids_t, attention_mask=mask_t, do_sample=False,
                                 max_new_tokens=max(r.max_tokens for r in group),
                                 pad_token_id=0, eos_token_id=EOS)
            seconds += time.perf_counter() - start
            width = ids_t.shape[1]
            useful += sum(useful_tokens(out[i, width:].tolist(), r.max_tokens)
                          for i, r in enumerate(group))
    return useful / seconds


def static_genai(path: Path, requests: list[Req], size: int) -> float:
    import numpy as np
    os.environ["ORT_DISABLE_TELEMETRY"] = "1"  # before GenAI loads onnxruntime
    import onnxruntime_genai as og

    model = og.Model(str(path))
    pad = json.loads((path / "genai_config.json").read_text())["model"]["pad_token_id"]

    def run(group: list[Req]) -> tuple[int, float]:
        ids, _ = pad_left([r.prompt for r in group], pad)
        width = len(ids[0])
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=width + max(r.max_tokens for r in group),
                                  do_sample=False, batch_size=len(group))
        start = time.perf_counter()
        generator = og.Generator(model, params)
        generator.append_tokens(np.asarray(ids, np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        elapsed = time.perf_counter() - start
        return sum(useful_tokens(list(generator.get_sequence(i))[width:], r.max_tokens)
                   for i, r in enumerate(group)), elapsed

    run([Req(-1, requests[0].prompt[:16], 2)])  # warm up
    useful, seconds = 0, 0.0
    for group in batches(requests, size):
        count, elapsed = run(group)
        useful, seconds = useful + count, seconds + elapsed
    return useful / seconds


# -- the report ------------------------------------------------------------------------------
def _mismatch_line(found: list[tuple[int, int]], requests: dict[int, Req]) -> str:
    if not found:
        return "every completed greedy answer equals the request generated alone"
    index, at = found[0]
    return (f"{len(found)} completed answer(s) DIFFER from the request alone; first: request "
            f"{index} (prompt {len(requests[index].prompt)} tokens, max_tokens "
            f"{requests[index].max_tokens}) from generated token {at}")


def build(args) -> tuple[Path, Path, object]:
    gen = _generate_bench()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    positions = args.max_positions
    folder = gen.make_checkpoint(work / f"llama-150m-{positions}", positions)
    artifact = work / f"dayzero-{positions}.dz"
    seconds = gen.build_dayzero(folder, artifact, positions, group_size=None,
                              reuse=args.reuse_build)
    print(f"  checkpoint {folder}; artifact {artifact} "
          + (f"(built in {seconds:.0f} s)" if not math.isnan(seconds) else "(reused)"))
    return folder, artifact, gen


def load_levels(args, server: Server, requests: list[Req]
                ) -> tuple[dict[int, list[Outcome]], dict[int, Summary]]:
    print(f"\n## streamed /v1/completions, {len(requests)} requests per concurrency "
          f"(closed loop), greedy")
    warm = requests[:1] + [r for r in requests if len(r.prompt) >= 1000][:1]
    asyncio.run(run_load(server.base, server.model_name, warm, 2, args.timeout))
    results, summaries = {}, {}
    for concurrency in args.concurrency:
        before = server.metrics()
        outcomes, wall, cut = asyncio.run(run_load(server.base, server.model_name, requests,
                                                   concurrency, args.timeout))
        results[concurrency] = outcomes
        summaries[concurrency] = s = summarize(outcomes, wall)
        print(summary_line(f"c={concurrency}", s) + (f"  CUT at --timeout {args.timeout:.0f} s"
                                                     if cut else ""))
        print(engine_line(before, server.metrics(), wall))
    samples = server.wait_idle()
    print(f"  server: preemptions {metric(samples, 'dayzero_preemptions_total'):.0f}, KV "
          f"blocks used when idle {metric(samples, 'dayzero_kv_blocks_used'):.0f}, RSS "
          f"{vm_rss(server.pid) / 2**20:.0f} MiB")
    return results, summaries


def soak(args, server: Server, pool: list[Req]) -> None:
    by_index = {r.index: r for r in pool}
    concurrency = args.soak_concurrency
    print(f"\n## soak: {args.soak:.0f} s at concurrency {concurrency}, {args.cancel_fraction:.0%}"
          f" of streams closed early, pool of {len(pool)} requests")
    outcomes, wall, _ = asyncio.run(run_load(server.base, server.model_name, pool, concurrency,
                                             args.timeout))
    print(summary_line("warm-up", summarize(outcomes, wall)))
    peak_before = metric(server.wait_idle(), "dayzero_kv_blocks_peak")
    rss_before = vm_rss(server.pid)
    outcomes, wall = asyncio.run(run_soak(server.base, server.model_name, pool, concurrency,
                                          args.soak, args.cancel_fraction, args.seed + 1,
                                          args.timeout))
    print(summary_line("soak", summarize(outcomes, wall)))
    samples = server.wait_idle()
    rss_after = vm_rss(server.pid)
    used = metric(samples, "dayzero_kv_blocks_used")
    free = metric(samples, "dayzero_kv_blocks_free")
    print(f"  KV blocks used {used:.0f} of {used + free:.0f} once idle; target 0: "
          f"{'met' if used == 0 else 'MISSED'}; the most in use at once "
          f"{peak_before:.0f} after the warm-up, {metric(samples, 'dayzero_kv_blocks_peak'):.0f}"
          f" after the soak")
    print(rss_verdict(rss_before, rss_after))
    cancelled_server = metric(samples, "dayzero_sequences_finished_total", reason="cancelled")
    print(f"  server counted {cancelled_server:.0f} cancelled sequences in all; the client "
          f"closed {sum(o.cancelled for o in outcomes)} streams early in the soak")
    done = sorted({o.index for o in outcomes if o.completed})
    reference = {i: server.alone(by_index[i]) for i in done}
    found = mismatches(outcomes, reference)
    print(f"  {sum(o.completed for o in outcomes)} completed answers of {len(done)} distinct "
          f"requests against each served alone: {_mismatch_line(found, by_index)}")


def compare_static(args, folder: Path, gen, requests: list[Req], continuous: dict) -> None:
    size = 8
    print(f"\n## static batches of {size} (left-padded generate) on the same {len(requests)} "
          f"requests: useful tokens/s")
    for name, run in (("transformers", lambda: static_transformers(folder, requests, size)),
                      ("ort-genai", lambda: _genai(folder, gen, requests, size))):
        try:
            print(f"  {name:<14}{run():8.1f} tok/s")
        except Exception as exc:  # noqa: BLE001 - a peer that cannot run is skipped
            print(f"  {name:<14}skipped: {(str(exc).strip().splitlines() or ['?'])[-1][:150]}")
    if size in continuous:
        print(f"  {'dayzero c=8':<14}{continuous[size].tokens_per_s:8.1f} tok/s (continuous "
              f"batching, above)")


def _genai(folder: Path, gen, requests: list[Req], size: int) -> float:
    os.environ["ORT_DISABLE_TELEMETRY"] = "1"  # before GenAI loads onnxruntime
    import onnxruntime_genai  # noqa: F401 - skip the build when it cannot run

    out = folder.parent / f"genai-fp32-{folder.name.rsplit('-', 1)[-1]}"
    gen.build_genai(folder, out, "fp32")
    return static_genai(out, requests, size)


def time_startup(artifact: Path, workdir: Path, startup_s: float, runs: int = 3) -> int:
    """`dayzero serve ARTIFACT` started `runs` times: seconds from the process's start to
    /health 200, and its memory then (the KV cache sized by itself, `--kv-cache-memory auto`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    times = []
    for _ in range(runs):
        server = Server(artifact, workdir, [], startup_s)
        times.append(server.healthy_s)
        rss = vm_rss(server.pid)
        server.stop()
        print(f"  start to healthy {server.healthy_s:.2f} s, RSS {rss / 2**20:.0f} MiB")
    best, worst = min(times), max(times)
    print(f"start to healthy: {best:.2f}-{worst:.2f} s over {runs} starts of {artifact} "
          f"(target for a tiny model: under 5 s: {'met' if worst < 5 else 'NOT met'})")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", default="/tmp/dayzero-generate-bench")
    p.add_argument("--max-positions", type=int, default=4096 + 64,
                   help="the checkpoint's and artifact's position range")
    p.add_argument("--requests", type=int, default=64, help="requests per concurrency")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--max-tokens", default="32:256",
                   help="max_tokens range, LOW:HIGH (chat answers run to a few hundred tokens; "
                        "16:64 was the first runs' shorter mix)")
    p.add_argument("--long-fraction", type=float, default=0.1,
                   help="share of 1000-2000-token documents among the prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=900,
                   help="seconds one concurrency level (or request) may take before it is cut")
    p.add_argument("--startup-timeout", type=float, default=300)
    p.add_argument("--max-queue", type=int, default=None, help="passed to dayzero serve")
    p.add_argument("--soak", type=float, default=0, metavar="SECONDS",
                   help="instead of the levels: mixed load with cancellations for SECONDS, "
                        "then the leak and consistency checks")
    p.add_argument("--soak-concurrency", type=int, default=16)
    p.add_argument("--cancel-fraction", type=float, default=0.25)
    p.add_argument("--compare-static", action="store_true",
                   help="also transformers' and ORT GenAI's static batches of 8")
    p.add_argument("--reuse-build", action="store_true",
                   help="serve the artifact an earlier run left in --workdir (not rebuilt)")
    p.add_argument("--server-spinning", choices=("true", "false"), default="true",
                   help="the server's ORT session spins (the one-at-a-time run always does)")
    p.add_argument("--skip-single", action="store_true",
                   help="skip the in-process one-at-a-time run (and the verdicts)")
    p.add_argument("--startup-only", metavar="ARTIFACT", default=None,
                   help="only time `dayzero serve ARTIFACT` from start to /health 200 (a tiny "
                        "model's target: under 5 s), three times")
    args = p.parse_args(argv)
    if args.startup_only:
        return time_startup(Path(args.startup_only), Path(args.workdir), args.startup_timeout)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    low, high = (int(x) for x in args.max_tokens.split(":"))
    requests = request_mix(args.requests, args.seed, args.max_positions, (low, high),
                           long_fraction=args.long_fraction)
    lengths = sorted(len(r.prompt) for r in requests)
    print(f"# dayzero serve benchmark: {len(requests)} requests (seed {args.seed}), prompts "
          f"{lengths[0]}-{lengths[-1]} tokens ({sum(n >= 1000 for n in lengths)} long), "
          f"max_tokens {low}-{high}; {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    folder, artifact, gen = build(args)
    # spinning on in the server and the one-at-a-time run alike by default (`auto` reads the load
    # average, which the previous level leaves high); `--server-spinning false` tries the server
    # with sleeping ORT threads, which leaves the cores to its event loop and the clients
    extra = ["--session", f"allow_spinning={args.server_spinning}"]
    extra += ["--max-queue", str(args.max_queue)] if args.max_queue else []
    server = Server(artifact, Path(args.workdir), extra, args.startup_timeout)
    print(f"  server pid {server.pid} on {server.base}, log {server.log_path}; start to healthy "
          f"{server.healthy_s:.2f} s")
    try:
        if args.soak:
            soak(args, server, requests)
            return 0
        results, summaries = load_levels(args, server, requests)
    finally:
        code = server.stop()
        print(f"  server stopped (exit {code})")
    by_index = {r.index: r for r in requests}
    if not args.skip_single:
        print("\n## the same requests one at a time, in-process (runtime.load(ART).stream)")
        single = single_requests(artifact, requests)
        print(f"  {single.tokens_per_s:.1f} tok/s, decode {single.decode_s * 1e3:.1f} ms/token "
              f"(median over requests)")
        for concurrency, outcomes in results.items():
            print(f"  c={concurrency}: "
                  f"{_mismatch_line(mismatches(outcomes, single.reference), by_index)}")
        if 8 in summaries:
            print("\n## continuous batching at concurrency 8 against one request at a time")
            for line in verdicts(summaries[8].tokens_per_s, single.tokens_per_s,
                                 summaries[8].tpot_p50, single.decode_s):
                print(line)
        if 1 in summaries and 8 in summaries:
            print(f"  (server c=8 / server c=1 throughput: "
                  f"{summaries[8].tokens_per_s / summaries[1].tokens_per_s:.2f}x)")
    if args.compare_static:
        compare_static(args, folder, gen, requests, summaries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
