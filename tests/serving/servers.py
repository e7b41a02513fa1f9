"""A `dayzero serve` subprocess on a free port of 127.0.0.1, and plain HTTP calls to it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

KV_CACHE = "4MiB"
STARTUP_S = 90.0
ROOT = Path(__file__).resolve().parents[2]


class Server:
    def __init__(self, artifact: Path, log: Path, *extra: str, prelude: str = "",
                 env: dict[str, str] | None = None):
        """`prelude`: Python run in the server process before the CLI (a test double's
        import); `env`: variables added to its environment."""
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        command = [sys.executable, "-c", prelude + "\nimport sys; from compiler.cli import "
                   "main; sys.exit(main(sys.argv[1:]))", "serve", str(artifact), "--port",
                   str(self.port), "--kv-cache-memory", KV_CACHE, "--log-level", "warning",
                   *extra]
        with open(log, "wb") as out:
            self.process = subprocess.Popen(command, cwd=ROOT, stdout=out,
                                            stderr=subprocess.STDOUT,
                                            env={**os.environ, **(env or {})})
        try:
            self.wait_healthy()
        except AssertionError:  # a server that never got healthy is not left running
            self.process.kill()
            self.process.wait()
            raise

    def wait_healthy(self, timeout: float = STARTUP_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited {self.process.returncode}:\n"
                                     f"{self.log.read_text()}")
            if self.get("/health")[0] == 200:
                return
            time.sleep(0.1)
        raise AssertionError(f"no /health 200 within {timeout} s:\n{self.log.read_text()}")

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()
        except OSError:
            return 0, ""

    def post(self, path: str, body: bytes | dict) -> tuple[int, dict | str]:
        """Status and decoded JSON (or text, for a stream) of a POST."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, text = response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read().decode()
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def metric(self, name: str) -> float:
        """The value of one metric sample (`name` with its labels, as exposed); 0 if absent."""
        status, text = self.get("/metrics")
        assert status == 200
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def client(self):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key="x", max_retries=0,
                             timeout=60)

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"the server did not exit within {timeout} s of SIGTERM:\n"
                                 f"{self.log.read_text()}") from None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
