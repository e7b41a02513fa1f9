"""A tensor-parallel generation artifact from one process: rank 0 here, the others started by it.

`runtime.load` of such an artifact makes this process rank 0: it starts ranks 1 .. N-1 on this
machine (`python -m runtime.generation.rank_step`, on 127.0.0.1 with a free port, dying with
this process), joins them on torch.distributed (gloo), and returns a
`TensorParallelGenerationModel`: a `GenerationModel` whose scheduler and sampling run here and
whose every step is broadcast to the other ranks first (runtime/generation/rank_step.py).

A rank that dies is noticed within a fraction of a second, by its process exiting (a watcher
thread) or by the step's collective failing: the model then refuses further steps with an error
naming the rank, and calls the `on_failure` callbacks (the server turns unhealthy and exits).
One tensor-parallel model per process at a time: torch.distributed has one default group.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from compiler.errors import DayzeroError

from ..comm import DEFAULT_TIMEOUT, RankFailure, Rendezvous
from ..distributed import RankModel, free_port, world_size
from .engine import StepRunner
from .model import GenerationModel
from .rank_step import FORWARD, STEP, STOP, WORKER, RankStepModel, StepChannel, rank_spec
from .step import StepPart

WATCH_SECONDS = 0.1  # how often the worker processes are checked
STOP_SECONDS = 10.0  # how long workers get to leave after a stop before they are killed
JOIN_GRACE_SECONDS = 5.0  # how long rank 0's join may take to fail after a rank died


class RankGroup:
    """Ranks 1 .. N-1 as child processes of this one (rank 0), watched."""

    def __init__(self, path: Path, world: int, timeout: float, verify: str,
                 kv_cache_memory: int | None):
        import torch.distributed as dist

        if dist.is_initialized():
            raise DayzeroError("this process already belongs to a torch.distributed group",
                               str(path), "close the other tensor-parallel model first "
                               "(model.close()), or load this one in another process")
        self.world, self.failure = world, None
        self._callbacks: list[Callable[[str], None]] = []
        self._closing = threading.Event()
        env = Rendezvous(0, world, "127.0.0.1", free_port(), agent_store=False)
        self.procs = {rank: self._start(rank, env, path, timeout, verify, kv_cache_memory)
                      for rank in range(1, world)}
        threading.Thread(target=self._watch, name="dayzero-ranks", daemon=True).start()
        try:
            self.rank_model = self._join(path, verify, timeout, env)
        except BaseException:
            self._closing.set()
            self._kill()
            raise
        self.channel = StepChannel(self.rank_model.comm)

    def _join(self, path: Path, verify: str, timeout: float, env: Rendezvous) -> RankModel:
        """Join the others and load rank 0's program, on a helper thread: joining waits for
        every rank inside torch.distributed, which nothing interrupts, so a rank that dies
        before it joins is reported from here at once, not after the join's timeout."""
        box: dict[str, Any] = {}

        def join() -> None:
            try:
                box["model"] = RankModel(path, verify=verify, timeout=timeout, env=env)
            except BaseException as exc:  # re-raised on the caller's thread
                box["error"] = exc

        thread = threading.Thread(target=join, name="dayzero-join", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(WATCH_SECONDS)
            if thread.is_alive() and self.failure is not None:
                # a rank that joined and then failed fails rank 0's join too, with its reason
                thread.join(JOIN_GRACE_SECONDS)
            if thread.is_alive() and self.failure is not None:
                raise RankFailure(f"{self.failure} while the {self.world} ranks were starting",
                                  str(path), "fix what that rank printed above and load again",
                                  [])
        if "error" in box:
            _leave_group()  # the join ended: leaving does not wait for anyone
            raise box["error"]
        return box["model"]

    @staticmethod
    def _start(rank: int, env: Rendezvous, path: Path, timeout: float, verify: str,
               memory: int | None) -> subprocess.Popen:
        threads = max(1, (os.cpu_count() or 1) // env.world_size)
        child = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(env.world_size),
                 "LOCAL_RANK": str(rank), "MASTER_ADDR": env.master_addr,
                 "MASTER_PORT": str(env.master_port),
                 "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads))}
        args = [sys.executable, "-m", WORKER, str(path), "--timeout", str(timeout),
                "--verify", verify]
        if memory is not None:
            args += ["--kv-cache-memory", str(memory)]
        return subprocess.Popen(args, env=child, stdin=subprocess.DEVNULL)

    # -- failures -----------------------------------------------------------------------------
    def on_failure(self, callback: Callable[[str], None]) -> None:
        """Call `callback(message)` (from another thread) when a rank fails; at once if one
        has already."""
        self._callbacks.append(callback)
        if self.failure is not None:
            callback(self.failure)

    def fail(self, message: str) -> None:
        if self.failure is not None or self._closing.is_set():
            return
        self.failure = message
        for callback in list(self._callbacks):
            callback(message)

    def check(self) -> None:
        """Raise the failure of a rank, if one failed."""
        if self.failure is not None:
            raise RankFailure(self.failure, f"{self.world} tensor-parallel ranks",
                              "the model cannot step without every rank: load it again", [])

    def _watch(self) -> None:
        while not self._closing.wait(WATCH_SECONDS):
            for rank, proc in self.procs.items():
                code = proc.poll()
                if code is not None and not self._closing.is_set():
                    self.fail(f"rank {rank} {_ended(code)}")
                    return

    # -- stepping -----------------------------------------------------------------------------
    def send(self, kind: int, parts: Sequence[StepPart] = ()) -> None:
        self.check()
        try:
            self.channel.send(kind, parts)
        except RankFailure as exc:
            self.fail(exc.what)
            raise

    def guard(self, call: Callable[[], Any]) -> Any:
        """Run this rank's share of a step the others were sent. Any failure is the group's:
        the others may be waiting in a collective of this step, so no later step may run."""
        try:
            return call()
        except RankFailure as exc:
            self.fail(exc.what)
            raise
        except BaseException as exc:
            what = exc.message() if isinstance(exc, DayzeroError) else \
                f"{type(exc).__name__}: {exc}"
            self.fail(f"rank 0 failed in a step: {what}")
            raise

    # -- ending -------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the other ranks (they finish the step they are in) and leave the group."""
        if self._closing.is_set():
            return
        failed = self.failure is not None
        self._closing.set()
        if not failed:
            try:
                self.channel.send(STOP)
                self.rank_model.close()
            except RankFailure:
                failed = True
        self._kill(grace=0.0 if failed else STOP_SECONDS)
        if failed:  # the group is left as it is: leaving it would wait for the dead
            self.rank_model.comm.watchdog.stop()

    def _kill(self, grace: float = 0.0) -> None:
        for proc in self.procs.values():
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _ended(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code} (its error is printed above)"


def _leave_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


class _RankStepRunner(StepRunner):
    """Rank 0's StepRunner: each step goes to the other ranks before it runs here."""

    def __init__(self, group: RankGroup, model: RankStepModel, spec):
        super().__init__(model, spec)
        self.group = group

    def run(self, parts: Sequence[StepPart]) -> tuple[np.ndarray, list[int]]:
        self.group.send(STEP, parts)
        return self.group.guard(lambda: super(_RankStepRunner, self).run(parts))


class TensorParallelGenerationModel(GenerationModel):
    """A generation artifact over N tensor-parallel ranks, driven from this process (rank 0):
    `generate`, `stream`, `generate_text` and `m(input_ids)` as for one process. `close()`
    stops the other ranks (also at exit); `on_failure(callback)` hears of a rank that died."""

    def __init__(self, group: RankGroup, kv_cache_memory: int | None = None):
        super().__init__(RankStepModel(group.rank_model), kv_cache_memory=kv_cache_memory)
        self.group = group
        self.ranks = group.world
        # checked here, before a step: the other ranks allocate their pools from it at start
        self._rank_spec = rank_spec(self.spec, self.ranks, kv_cache_memory)
        atexit.register(self.close)

    def __repr__(self) -> str:
        return f"TensorParallelGenerationModel({str(self.path)!r}, {self.ranks} ranks)"

    @property
    def runner(self) -> StepRunner:
        if self._runner is None:
            self._runner = _RankStepRunner(self.group, self.step_model, self._rank_spec)
        return self._runner

    def _all_logits(self, part: StepPart) -> np.ndarray:
        self.group.send(FORWARD, [part])
        return self.group.guard(lambda: super(TensorParallelGenerationModel,
                                              self)._all_logits(part))

    @property
    def failure(self) -> str | None:
        """Why a rank failed (None while every rank runs)."""
        return self.group.failure

    def on_failure(self, callback: Callable[[str], None]) -> None:
        self.group.on_failure(callback)

    def close(self) -> None:
        self.group.close()


def load_tensor_parallel(path: str | Path, manifest: dict[str, Any], verify: str = "full",
                         timeout: float | None = None,
                         kv_cache_memory: int | None = None) -> TensorParallelGenerationModel:
    """`runtime.load` of a tensor-parallel generation artifact: this process is rank 0 and
    starts the others (see the module docstring)."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        raise DayzeroError("a tensor-parallel generation artifact starts its own ranks; it is "
                           "not run under torchrun", str(path),
                           "call runtime.load (or dayzero generate / dayzero serve --nproc N) "
                           "in one plain process")
    group = RankGroup(Path(path), world_size(manifest), timeout or DEFAULT_TIMEOUT, verify,
                      kv_cache_memory)
    try:
        return TensorParallelGenerationModel(group, kv_cache_memory)
    except BaseException:
        group.close()
        raise
