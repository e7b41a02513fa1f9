"""Fuzzed HTTP bodies against `dayzero serve`: never a 500, every answer OpenAI's, /health fast.

Each case starts from a valid body of /v1/completions or /v1/chat/completions (a short prompt
or chat, a few tokens) and mutates it, seeded: fields replaced by wrong types, huge or tiny
numbers, NaN and Infinity (raw JSON text), lone surrogates, deep nesting, strings of up to a few
MB (within the 16 MiB limit), fields dropped, fields added, many messages; or the raw body
broken (truncated JSON, invalid UTF-8, UTF-16, random bytes, not an object, a wrong
Content-Type, a Content-Length over the limit that is never sent, a body over the limit sent
chunked). Outcomes are counted by status; `bad` lists every answer that is a 500, not JSON, not
in OpenAI's error shape (`{"error": {"message": str, "type": str, ...}}`), or a 200 that is not
a completion, and `transport` every request that got no answer (the server closed the
connection on a 413 while the body was still being sent counts as answered if the 413 was
read). Meanwhile a thread asks /health every 20 ms; its latency p50/p99/max are reported.

Targets (issue 33): 0 bad over 5,000 cases; /health p99 well under a second.

    python benchmarks/fuzz_http.py --url http://127.0.0.1:8000 --cases 5000
    python benchmarks/fuzz_http.py --artifact lm.dz --cases 5000   # serves it on a free port

Only 127.0.0.1 is ever contacted (`run` refuses any other host).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("/v1/completions", "/v1/chat/completions")
LIMIT = 16 * 2**20
WORDS = ["hello", "world", "the", "model", "runs", "on", "day", "zero", "a", "cat", "sat"]
EXPECTED = {200, 400, 404, 405, 408, 413, 429, 503}


@dataclass
class Case:
    path: str
    body: bytes
    headers: dict[str, str]
    mutation: str
    method: str = "POST"
    chunked: bool = False
    send_body: bool = True


# -- valid bodies ----------------------------------------------------------------------------

def _valid(rng: random.Random, chat: bool, model: str) -> dict:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8)))
    body: dict = {"model": model, "max_tokens": rng.randint(1, 4)}
    if chat:
        body["messages"] = [{"role": rng.choice(["user", "system"]), "content": words}]
    else:
        body["prompt"] = words if rng.random() < 0.7 else [rng.randint(3, 200)
                                                           for _ in range(rng.randint(1, 6))]
    for key, value in (("temperature", rng.choice([0, 0.7, 1.0, 1e-320])),
                       ("top_p", rng.choice([1, 0.9])), ("seed", rng.randint(0, 99)),
                       ("stream", rng.random() < 0.3), ("stop", rng.choice(["cat", ["a"]]))):
        if rng.random() < 0.4:
            body[key] = value
    return body


# -- hostile values: Python values, or _Raw JSON text spliced in (NaN, huge numbers, nesting) --

@dataclass(frozen=True)
class _Raw:
    text: str


def _hostile(rng: random.Random):
    """One hostile value (a string of up to a few MB at most once in ~25 draws)."""
    k = rng.randrange(26)
    if k == 0:
        return "x" * rng.choice([100_000, 1_000_000, 4_000_000])
    if k == 1:
        return _Raw(_nested(rng))
    return rng.choice([
        None, True, False, 0, -1, 1, 2, 3.5, -2.5, 2**31, 2**63, -2**63, 2**64, 1e308, -1e308,
        1e-320, 5e-324, "", "hello", "\ud800", "a\udfffb", "\ud83d\ude00", "\x00", [], {},
        [1, 2], [[]], {"a": 1}, [{"role": "user"}], [{"type": "text", "text": 5}],
        _Raw("NaN"), _Raw("Infinity"), _Raw("-Infinity"), _Raw("1" * 5000), _Raw("1e999"),
        _Raw("-0.0"), _Raw("1" * 4000), "\ud800" * 10, ["\ud800"], {"\ud800": 1},
        [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}],
    ])


def _nested(rng: random.Random) -> str:
    depth = rng.choice([10, 63, 64, 65, 200, 999, 1000, 5000, 100_000])
    if rng.random() < 0.5:
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def _encode(value) -> str:
    """JSON text of `value` with every _Raw spliced in (and lone surrogates kept as escapes)."""
    raws: list[str] = []

    def walk(v):
        if isinstance(v, _Raw):
            raws.append(v.text)
            return f"__RAW_{len(raws) - 1}__"
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    text = json.dumps(walk(value))
    for i, raw in enumerate(raws):
        text = text.replace(f'"__RAW_{i}__"', raw, 1)
    return text


# -- mutations -------------------------------------------------------------------------------

FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature",
          "top_p", "seed", "stop", "stream", "stream_options", "n", "best_of", "echo",
          "logprobs", "user", "tools", "response_format", "logit_bias"]


def _mutate_fields(rng: random.Random, body: dict) -> str:
    done = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(6)
        key = rng.choice(FIELDS)
        if kind == 0 and body:
            key = rng.choice(sorted(body))
            del body[key]
            done.append(f"drop {key}")
        elif kind == 1:
            name = rng.choice(["extra", "x" * 300, "\ud800", "", "prompt ", "__proto__"])
            body[name] = _hostile(rng)
            done.append("add field")
        elif kind == 2 and isinstance(body.get("messages"), list):
            done.append("messages: " + _mutate_messages(rng, body["messages"]))
        else:
            body[key] = _hostile(rng)
            done.append(f"set {key}")
    return ", ".join(done)


def _mutate_messages(rng: random.Random, messages: list) -> str:
    k = rng.randrange(5)
    if k == 0:
        messages.extend({"role": "user", "content": "hello"} for _ in range(rng.choice(
            [10, 300, 20_000])))
        return "many messages"
    target = messages[0] if messages and isinstance(messages[0], dict) else None
    if target is None:
        messages.append(_hostile(rng))
        return "a hostile message"
    if k == 1:
        target["role"] = _hostile(rng)
        return "role"
    if k == 2:
        target["content"] = _hostile(rng)
        return "content"
    if k == 3:
        target["content"] = [{"type": "text", "text": rng.choice(["hi", "\ud800", 5])},
                             _hostile(rng)]
        return "content parts"
    messages.append(_hostile(rng))
    return "a hostile message"


def _raw_mutation(rng: random.Random, text: str) -> tuple[bytes, str]:
    data = text.encode("utf-8", "surrogatepass")
    k = rng.randrange(7)
    if k == 0:
        return data[:rng.randrange(len(data))], "truncated"
    if k == 1:
        at = rng.randrange(len(data))
        return data[:at] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80"]) \
            + data[at:], "invalid UTF-8"
    if k == 2:
        return text.encode("utf-16", "surrogatepass"), "UTF-16"
    if k == 3:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 64))), "random bytes"
    if k == 4:
        return rng.choice([b"", b"null", b"[]", b"[1,2]", b'"s"', b"1", b"{}"]), "not an object"
    if k == 5:
        data = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data), "bytes flipped"
    return data + b" garbage", "trailing garbage"


def make_case(rng: random.Random, model: str) -> Case:
    chat = rng.random() < 0.5
    path = PATHS[chat]
    body = _valid(rng, chat, model)
    headers = {"Content-Type": "application/json"}
    roll = rng.random()
    if roll < 0.03:
        return Case(path, b"", {**headers, "Content-Length": str(rng.choice(
            [LIMIT + 1, 100_000_000]))}, "declared over the limit", send_body=False)
    if roll < 0.04:
        return Case(path, b"x" * (LIMIT + 1024), headers, "chunked over the limit",
                    chunked=True)
    if roll < 0.07:
        return Case(path, _encode(body).encode(), headers, "wrong method", method="GET")
    mutation = _mutate_fields(rng, body) if roll < 0.8 else "valid"
    text = _encode(body)
    data = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.15:
        data, raw = _raw_mutation(rng, text)
        mutation += f", {raw}"
    if rng.random() < 0.1:
        headers["Content-Type"] = rng.choice(["text/plain", "application/x-www-form-urlencoded",
                                              "multipart/form-data; boundary=x", ""])
        mutation += ", content-type"
    return Case(path, data, headers, mutation)


# -- sending and judging -----------------------------------------------------------------------

def send(host: str, port: int, case: Case, timeout: float = 120) -> tuple[int, bytes, str]:
    """Status, body and Content-Type of the answer; status 0 if none came."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        if case.chunked:
            connection.putrequest(case.method, case.path)
            for name, value in case.headers.items():
                connection.putheader(name, value)
            connection.putheader("Transfer-Encoding", "chunked")
            connection.endheaders()
            try:
                for at in range(0, len(case.body), 1 << 20):
                    piece = case.body[at:at + (1 << 20)]
                    connection.send(b"%x\r\n%s\r\n" % (len(piece), piece))
                connection.send(b"0\r\n\r\n")
            except OSError:  # the server answered 413 and closed: read the answer
                pass
        elif not case.send_body:
            connection.putrequest(case.method, case.path)
            for name, value in case.headers.items():
                connection.putheader(name, value)
            connection.endheaders()
        else:
            connection.request(case.method, case.path, body=case.body, headers=case.headers)
        response = connection.getresponse()
        return response.status, response.read(), response.getheader("Content-Type") or ""
    except (OSError, http.client.HTTPException):
        return 0, b"", ""
    finally:
        connection.close()


def judge(case: Case, status: int, data: bytes, content_type: str) -> str | None:
    """Why this answer is wrong, or None."""
    if status == 0:
        return None  # counted as transport
    if status not in EXPECTED:
        return f"status {status}"
    if status == 200 and content_type.startswith("text/event-stream"):
        return _judge_stream(data)
    try:
        answer = json.loads(data)
    except ValueError:
        return f"{status} not JSON: {data[:80]!r}"
    if status == 200:
        ok = isinstance(answer, dict) and isinstance(answer.get("choices"), list)
        return None if ok else f"200 without choices: {data[:80]!r}"
    error = answer.get("error") if isinstance(answer, dict) else None
    if not (isinstance(error, dict) and isinstance(error.get("message"), str)
            and isinstance(error.get("type"), str)):
        return f"{status} not in OpenAI's error shape: {data[:80]!r}"
    return None


def _judge_stream(data: bytes) -> str | None:
    events = [line[6:] for line in data.decode("utf-8", "replace").split("\n")
              if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return "a stream without [DONE]"
    for event in events[:-1]:
        try:
            chunk = json.loads(event)
        except ValueError:
            return f"a stream chunk not JSON: {event[:80]!r}"
        if "error" in chunk:
            return f"an error in a stream: {event[:120]}"
    return None


# -- the run -----------------------------------------------------------------------------------

@dataclass
class Report:
    statuses: Counter = field(default_factory=Counter)
    bad: list[tuple[str, str]] = field(default_factory=list)  # (mutation, why)
    transport: list[str] = field(default_factory=list)
    health: list[float] = field(default_factory=list)  # seconds per /health
    health_failures: int = 0
    seconds: float = 0.0

    @property
    def server_errors(self) -> int:
        return self.statuses[500]

    def health_quantile(self, q: float) -> float:
        if not self.health:
            return float("nan")
        ordered = sorted(self.health)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def lines(self) -> list[str]:
        shown = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        out = [f"{sum(self.statuses.values())} requests in {self.seconds:.1f} s; by status: "
               f"{shown}",
               f"/health: {len(self.health)} answers, p50 {self.health_quantile(0.5) * 1e3:.1f}"
               f" ms, p99 {self.health_quantile(0.99) * 1e3:.1f} ms, max "
               f"{max(self.health, default=float('nan')) * 1e3:.1f} ms; "
               f"{self.health_failures} not 200",
               f"bad answers: {len(self.bad)}; no answer: {len(self.transport)}"]
        out += [f"  BAD {why}  <- {mutation}" for mutation, why in self.bad[:20]]
        out += [f"  NO ANSWER  <- {mutation}" for mutation in self.transport[:10]]
        return out


def _health_loop(host: str, port: int, stop: threading.Event, report: Report) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        connection = http.client.HTTPConnection(host, port, timeout=60)
        try:
            connection.request("GET", "/health")
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                report.health_failures += 1
        except (OSError, http.client.HTTPException):
            report.health_failures += 1
        finally:
            connection.close()
        report.health.append(time.perf_counter() - started)
        stop.wait(0.02)


def run(base_url: str, cases: int, seed: int = 0, model: str | None = None,
        concurrency: int = 4) -> Report:
    """Send `cases` fuzzed requests to the server at `base_url` (127.0.0.1 only), `concurrency`
    at a time, while /health is polled; the report."""
    url = urlsplit(base_url)
    host, port = url.hostname, url.port or 80
    if host not in ("127.0.0.1", "localhost"):
        raise SystemExit(f"fuzz_http sends only to 127.0.0.1, not {host}")
    model = model or _served_model(host, port)
    report = Report()
    stop = threading.Event()
    poller = threading.Thread(target=_health_loop, args=(host, port, stop, report), daemon=True)
    started = time.perf_counter()
    poller.start()

    def one(index: int) -> None:
        case = make_case(random.Random(seed * 1_000_003 + index), model)  # made when sent
        status, data, content_type = send(host, port, case)
        report.statuses[status] += 1
        if status == 0:
            report.transport.append(case.mutation)
        why = judge(case, status, data, content_type)
        if why is not None:
            report.bad.append((case.mutation, why))

    try:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, range(cases)))
    finally:
        stop.set()
        poller.join(60)
    report.seconds = time.perf_counter() - started
    return report


def _served_model(host: str, port: int) -> str:
    connection = http.client.HTTPConnection(host, port, timeout=30)
    try:
        connection.request("GET", "/v1/models")
        return json.loads(connection.getresponse().read())["data"][0]["id"]
    finally:
        connection.close()


def _serve(artifact: str, log: Path) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-c", "import sys; from compiler.cli import "
                                    "main; sys.exit(main(sys.argv[1:]))", "serve", artifact,
                                    "--port", str(port), "--log-level", "warning"], cwd=ROOT,
                                   stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited {process.returncode}: see {log}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return process, port
        except OSError:
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit(f"the server never got healthy: see {log}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8000")
    where.add_argument("--artifact", help="a generation artifact to serve on a free port")
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    process = None
    url = args.url
    if args.artifact:
        process, port = _serve(args.artifact, Path(tempfile.gettempdir()) / "fuzz_http-serve.log")
        url = f"http://127.0.0.1:{port}"
    try:
        report = run(url, args.cases, args.seed, concurrency=args.concurrency)
    finally:
        if process is not None:
            process.terminate()
            process.wait(60)
    print("\n".join(report.lines()))
    return 0 if not report.bad and not report.server_errors else 1


if __name__ == "__main__":
    sys.exit(main())
