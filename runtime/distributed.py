"""Multi-rank execution of a partitioned artifact on torch.distributed.

Three ways in, one worker underneath:

- `dayzero run model.dz --nproc N` (and `runtime.load` outside a distributed job) starts N ranks
  on this machine through torch.distributed's elastic launcher (what torchrun runs), on
  127.0.0.1 with a free port, and collects the outputs: `launch`, `LaunchedModel`.
- torchrun on one or several machines runs `python -m runtime.distributed model.dz ...` on every
  rank (docs/parallel.md shows the rendezvous flags): `main`.
- inside a job that already has its ranks (torchrun running the user's script),
  `runtime.load(path)` gives a `RankModel` that runs this rank's part; every rank calls it with
  the same inputs and gets the outputs.

Each rank checks that the world size matches the artifact, opens only its own weight shards,
joins gloo with a collective timeout and a watchdog (`comm`), and runs its program
(`rank_exec`); a failing rank records why before it exits, so the others exit naming it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from compiler.errors import ArtifactError, DayzeroError

from .artifact import Artifact, open_artifact
from .artifact import _read_manifest as read_manifest
from .comm import DEFAULT_TIMEOUT, Rendezvous, TorchCommunicator, barrier, connect
from .index_inputs import read_index_inputs
from .npz_files import write_npz
from .specs import TensorSpec, specs_from_manifest
from .stale_dirs import mark, sweep
from .to_numpy import to_numpy
from .validate import check_output_shapes, prepare_inputs

WORKER = "runtime.distributed"
RUN_SECONDS = "__dayzero_run_seconds__"  # extra entry of the output rank's .npz


MAX_WORLD_SIZE = 65536  # far beyond any real job; bounds what an edited manifest can launch


def world_size(manifest: dict[str, Any]) -> int:
    """`parallel.world_size`, checked against the rank entries the artifact lists.

    Never trusted by itself: it decides how many processes a launch starts.
    """
    parallel = manifest.get("parallel", {})
    where = "manifest.json: parallel.world_size"
    fix = "the artifact is corrupted or was edited; recompile it"
    want = parallel.get("world_size", 1)
    if type(want) is not int or not 1 <= want <= MAX_WORLD_SIZE:
        raise ArtifactError(f"parallel.world_size is {_short(want)}, not a whole number in "
                            f"[1, {MAX_WORLD_SIZE}]", where, fix)
    ranks = parallel.get("ranks")
    listed = [r.get("rank") if isinstance(r, dict) else None for r in ranks] \
        if isinstance(ranks, list) else [None]
    if any(type(r) is not int for r in listed):
        raise ArtifactError("parallel.ranks is not a list of rank entries", where, fix)
    listed.sort()
    if listed != list(range(want)):
        shown = listed if len(listed) <= 8 else f"{listed[:8]} ... ({len(listed)} in all)"
        raise ArtifactError(f"parallel.world_size is {want} but the artifact lists ranks "
                            f"{shown} (parallel.ranks)", where,
                            f"a world of {want} needs exactly ranks 0..{want - 1}; {fix}")
    return want


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def output_rank(manifest: dict[str, Any]) -> int:
    """The first rank of the last pipeline stage: it holds the whole outputs."""
    ranks = manifest["parallel"]["ranks"]
    last = max(r.get("coords", {}).get("pp", 0) for r in ranks)
    return min(r["rank"] for r in ranks if r.get("coords", {}).get("pp", 0) == last)


def check_world(manifest: dict[str, Any], actual: int, where: str) -> None:
    want = world_size(manifest)
    if want == actual:
        return
    if want == 1:
        raise DayzeroError(f"the artifact is not partitioned (it runs on one rank), but {actual} "
                           "were started", where, "run it without --nproc, or compile it with a "
                           "`parallel:` config (docs/parallel.md)")
    raise DayzeroError(f"the artifact is partitioned for {want} ranks, but {actual} were "
                       "started", where, f"start exactly {want} ranks (--nproc {want}, or "
                       "torchrun --nnodes x --nproc-per-node with that product)")


class RankModel:
    """This rank's part of a partitioned artifact, inside a running torch.distributed job.

    Every rank calls it with the same inputs (numpy arrays or torch tensors) and gets the same
    outputs, broadcast from the last pipeline stage.
    """

    def __init__(self, path: str | Path, verify: str = "full",
                 timeout: float = DEFAULT_TIMEOUT, env: Rendezvous | None = None):
        self.env = env or Rendezvous.from_env()
        manifest = read_manifest(Path(path))  # the format only: the files are checked below
        check_world(manifest, self.env.world_size, f"rank {self.env.rank}")
        self.input_specs: list[TensorSpec] = specs_from_manifest(manifest, "inputs")
        self.output_specs: list[TensorSpec] = specs_from_manifest(manifest, "outputs")
        self.index_ranges = read_index_inputs(manifest, [s.name for s in self.input_specs])
        groups = [g for axis in sorted(manifest["parallel"].get("groups", {}))
                  for g in manifest["parallel"]["groups"][axis]]
        # join first, so that a rank failing to load is reported to the others by name
        self.comm: TorchCommunicator = connect(self.env, groups, timeout)
        try:
            from .rank_exec import RankExecutor

            self.artifact = open_artifact(path, verify=verify, rank=self.env.rank)
            # the manifest's specs proven equal to the graph's before they are trusted
            self.artifact.check_consistency(self.input_specs, self.output_specs)
            self.program = RankExecutor(self.artifact, self.env.rank)
        except BaseException as exc:
            self.comm.watchdog.fail(_describe(exc))
            raise
        barrier(self.comm, "loading the artifact")

    @property
    def path(self) -> Path:
        return self.artifact.root

    def __call__(self, *inputs: Any) -> tuple[np.ndarray, ...]:
        from compiler.ir.ops.collective import bind_communicator

        arrays, bindings = prepare_inputs(self.input_specs, inputs, self.index_ranges)
        try:
            with bind_communicator(self.comm):
                outputs = self.program(arrays, bindings)
            return tuple(self._share(outputs, bindings))
        except BaseException as exc:
            self.comm.watchdog.fail(_describe(exc))
            raise

    def _share(self, outputs: list, bindings: dict[str, int]) -> list[np.ndarray]:
        """Broadcast the outputs from the output rank to every rank."""
        import torch
        import torch.distributed as dist

        from .dims import eval_dim
        from .rank_exec import to_torch

        src = output_rank(self.artifact.manifest)
        shared = []
        for i, spec in enumerate(self.output_specs):
            shape = [d if isinstance(d, int) else eval_dim(d, bindings) for d in spec.shape]
            dtype = _torch_dtype(spec.dtype)
            t = to_torch(outputs[i]).contiguous() if self.env.rank == src else \
                torch.empty(shape, dtype=dtype)
            try:
                dist.broadcast(t, src)
            except RuntimeError as exc:
                raise self.comm.failure("broadcast of the outputs", [src], exc) from None
            shared.append(to_numpy(t))
        return shared

    def close(self) -> None:
        """Leave the process group (every rank calls it; waits for the others first)."""
        import torch.distributed as dist

        self.comm.watchdog.stop()
        if dist.is_initialized():
            barrier(self.comm, "shutting down")
            dist.destroy_process_group()


def _torch_dtype(name: str):
    from compiler.ir import DType

    return DType(name).to_torch()


def _describe(exc: BaseException) -> str:
    return exc.message() if isinstance(exc, DayzeroError) else f"{type(exc).__name__}: {exc}"


# -- the worker: one rank started by a launcher -----------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """`python -m runtime.distributed ARTIFACT [--inputs FILE.npz] [--output FILE.npz]`."""
    parser = argparse.ArgumentParser(prog=f"python -m {WORKER}",
                                     description="one rank of a partitioned dayzero artifact")
    parser.add_argument("artifact")
    parser.add_argument("--inputs", help=".npz holding every model input by name")
    parser.add_argument("--output", help=".npz to write the outputs to (by the output rank)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help="seconds a collective waits for its peers")
    parser.add_argument("--verify", choices=("full", "size"), default="full")
    args = parser.parse_args(argv)
    rank = os.environ.get("RANK", "?")
    _die_with_parent()
    model = None
    try:
        model = RankModel(args.artifact, verify=args.verify, timeout=args.timeout)
        inputs = _read_inputs(args.inputs, model.input_specs)
        start = time.perf_counter()
        outputs = model(*inputs)
        seconds = time.perf_counter() - start
        if args.output and model.env.rank == output_rank(model.artifact.manifest):
            write_npz(Path(args.output), {**{s.name: o for s, o in zip(model.output_specs,
                                                                         outputs)},
                                          RUN_SECONDS: np.array(seconds)})
        model.close()
        return 0
    except DayzeroError as exc:
        return _fail(rank, model, exc.message())
    except Exception as exc:
        return _fail(rank, model, f"internal error: {type(exc).__name__}: {exc}")


def _fail(rank: str, model: RankModel | None, message: str) -> int:
    """Report, record for the peers and the launcher, and leave at once (no hanging teardown)."""
    text = message if message.startswith("rank ") else f"rank {rank}: {message}"
    print(f"error: {text}", file=sys.stderr, flush=True)
    if model is not None:
        model.comm.watchdog.fail(message)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        now = time.time()
        Path(error_file).write_text(json.dumps({"message": text, "timestamp": int(now),
                                                "dayzero_time": now}))
    sys.stdout.flush()
    os._exit(1)


def _read_inputs(path: str | None, specs: list[TensorSpec]) -> list[np.ndarray]:
    if path is None:
        raise DayzeroError("no --inputs file given", "worker arguments",
                           "write the inputs with numpy.savez(NAME=array, ...)")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise DayzeroError(f"cannot read inputs {path}: {exc}", path) from None
    missing = [s.name for s in specs if s.name not in arrays]
    if missing:
        raise DayzeroError(f"inputs file {path} has no {', '.join(missing)}", path)
    return [arrays[s.name] for s in specs]




# -- launching ranks on this machine ----------------------------------------------------------

def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the launcher binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RUN_DIR_PREFIX = "dayzero-run-"
SHUTDOWN_SECONDS = 5  # how long stopped ranks get to exit before they are killed
_RUN_DIR = re.compile(rf"^{RUN_DIR_PREFIX}\d+-\w+$")
RUN_DIR_PURPOSE = "launch"  # the marker's purpose (runtime.stale_dirs)
_STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")


def launch(artifact: str | Path, nproc: int, inputs: dict[str, np.ndarray], *,
           timeout: float = DEFAULT_TIMEOUT, verify: str = "full") -> dict[str, np.ndarray]:
    """Run a partitioned artifact on `nproc` local ranks; returns the outputs by name.

    Everything a launch writes (inputs, outputs, the elastic agent's logs and error files) lives
    in one folder, dayzero-run-PID-xxxx in the temp dir, marked as the launcher's
    (`runtime.stale_dirs`), removed when the launch ends, also on SIGTERM; a folder left by a
    launcher that was killed outright is swept by the next launch.
    Ranks die with their launcher (they ask the kernel for SIGKILL when their parent goes).
    """
    sweep_run_dirs()
    with _stopped_by_signals():  # outermost: the folder is removed before the signal ends us
        tmp = Path(tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-"))
        try:
            mark(tmp, RUN_DIR_PURPOSE)
            return _launch_in(tmp, artifact, nproc, inputs, timeout, verify)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _launch_in(tmp: Path, artifact: str | Path, nproc: int, inputs: dict[str, np.ndarray],
               timeout: float, verify: str) -> dict[str, np.ndarray]:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    in_path, out_path = tmp / "inputs.npz", tmp / "outputs.npz"
    write_npz(in_path, inputs)
    options = {"shutdown_timeout": SHUTDOWN_SECONDS} \
        if "shutdown_timeout" in LaunchConfig.__dataclass_fields__ else {}
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=uuid.uuid4().hex,
        rdzv_backend="static", rdzv_endpoint=f"127.0.0.1:{free_port()}",
        rdzv_configs={"rank": 0, "timeout": int(timeout)}, max_restarts=0,
        monitor_interval=0.1, local_addr="127.0.0.1",
        logs_specs=DefaultLogsSpecs(log_dir=str(tmp / "elastic")), **options)
    args = ["-m", WORKER, str(artifact), "--inputs", str(in_path), "--output",
            str(out_path), "--timeout", str(timeout), "--verify", verify]
    threads = max(1, (os.cpu_count() or 1) // nproc)
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    try:
        with _quiet_launcher():
            elastic_launch(config, sys.executable)(*args)
    except ChildFailedError as exc:
        raise _launch_error(exc) from None
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
    with np.load(out_path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


class _Stopped(BaseException):
    def __init__(self, signum: int):
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum


@contextlib.contextmanager
def _stopped_by_signals():
    """SIGTERM, SIGINT or SIGHUP during a launch: unwind (the agent stops the ranks and the
    caller's `finally` removes the run folder), then end as the signal would have ended us.

    The elastic agent installs its own handlers while its ranks run (raising SignalException);
    both are turned into the signal's own ending here. Only the main thread can set handlers.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for name in _STOP_SIGNALS:
        sig = getattr(signal, name)
        previous[sig] = signal.getsignal(sig)
        if previous[sig] not in (signal.SIG_IGN, None):
            signal.signal(sig, _raise_stopped)
    stopped = None
    try:
        yield
    except _Stopped as exc:
        stopped = exc.signum
    except SignalException as exc:
        stopped = int(exc.sigval)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    if stopped is not None:
        signal.raise_signal(stopped)  # the caller's handler, or the default ending
        raise KeyboardInterrupt if stopped == signal.SIGINT else SystemExit(128 + stopped)


def _raise_stopped(signum, frame):
    raise _Stopped(signum)


def sweep_run_dirs(parent: str | Path | None = None) -> list[Path]:
    """Remove run folders of launchers that are gone (killed outright); returns them.

    Only folders named like a launcher's that carry a launcher's marker whose process provably
    no longer runs: an unmarked folder of that name is not ours, whatever its age.
    """
    return sweep(Path(parent or tempfile.gettempdir()), _RUN_DIR, RUN_DIR_PURPOSE)


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this rank when its launcher dies (Linux; elsewhere nothing):
    a launcher killed outright must not leave ranks running until their collectives time out."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the launcher died before the request took effect
        os._exit(1)


def _launch_error(exc) -> DayzeroError:
    """One message for the parent: the rank(s) that failed first, and the ones that followed.

    When one rank fails the launcher stops the others with SIGTERM, and peers of a dead rank
    fail naming it a few seconds later: those are consequences. So the cause is a rank killed
    by another signal (SIGKILL, a crash) if any — the launcher never sends those first —, else
    the rank(s) that failed by themselves first (by the time in their error files).
    """
    failures = dict(exc.failures)
    causes = _first_failures(failures)
    after = sorted(set(failures) - set(causes))
    lines = []
    for rank, failure in sorted(causes.items()):
        lines.append(f"rank {rank} {_what_happened(rank, failure)}")
    stopped = [r for r in after if failures[r].exitcode == -signal.SIGTERM]
    followed = [r for r in after if r not in stopped]
    if followed:
        lines.append(f"rank(s) {', '.join(map(str, followed))} failed after that")
    if stopped:
        lines.append(f"rank(s) {', '.join(map(str, stopped))} were stopped by the launcher")
    first = ", ".join(map(str, sorted(causes))) if causes else "?"
    who = f"rank {first}" if len(causes) <= 1 else f"ranks {first}"
    killed = all(f.exitcode < 0 for f in causes.values())
    fix = (f"find out why {who} died (killed, out of memory, crashed) and run again" if killed
           else f"fix what {who} reports (its full error is above) and run again")
    return DayzeroError("; ".join(lines), who, fix)


def _first_failures(failures: dict[int, Any]) -> dict[int, Any]:
    killed = {r: f for r, f in failures.items()
              if f.exitcode < 0 and -f.exitcode != signal.SIGTERM}
    if killed:
        return killed
    own = {r: f for r, f in failures.items() if f.exitcode >= 0}
    if not own:
        return failures
    times = {r: _failure_time(f) for r, f in own.items()}
    start = min(times.values())
    return {r: f for r, f in own.items() if times[r] - start < 1.0}


def _failure_time(failure) -> float:
    data = getattr(failure, "error_file_data", None)
    if isinstance(data, dict) and isinstance(data.get("dayzero_time"), (int, float)):
        return float(data["dayzero_time"])
    return float(failure.timestamp)


def _what_happened(rank: int, failure) -> str:
    if failure.exitcode < 0:
        try:
            name = signal.Signals(-failure.exitcode).name
        except ValueError:
            name = f"signal {-failure.exitcode}"
        return f"was killed by {name}"
    text = str(failure.message or f"exited with code {failure.exitcode}").splitlines()[0]
    return f"failed: {text.removeprefix(f'rank {rank}: ')}"


@contextlib.contextmanager
def _quiet_launcher():
    """The launcher logs each stop and failure; the ranks and `_launch_error` say it better."""
    log = logging.getLogger("torch.distributed.elastic")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


class LaunchedModel:
    """A partitioned artifact called from a plain process: each call launches its ranks."""

    def __init__(self, artifact: Artifact, verify: str = "full",
                 timeout: float = DEFAULT_TIMEOUT):
        self.artifact, self.verify, self.timeout = artifact, verify, timeout
        self.nproc = world_size(artifact.manifest)
        self.input_specs = specs_from_manifest(artifact.manifest, "inputs")
        self.output_specs = specs_from_manifest(artifact.manifest, "outputs")
        artifact.check_consistency(self.input_specs, self.output_specs)
        self.last_timing: dict[str, float] | None = None
        self.index_ranges = read_index_inputs(artifact.manifest,
                                              [s.name for s in self.input_specs])

    @property
    def path(self) -> Path:
        return self.artifact.root

    @property
    def manifest(self) -> dict[str, Any]:
        return self.artifact.manifest

    def __repr__(self) -> str:
        return f"LaunchedModel({str(self.path)!r}, {self.nproc} ranks)"

    def __call__(self, *inputs: Any) -> tuple[np.ndarray, ...]:
        arrays, values = prepare_inputs(self.input_specs, inputs, self.index_ranges)
        named = {s.name: a for s, a in zip(self.input_specs, arrays)}
        out = launch(self.path, self.nproc, named, timeout=self.timeout, verify=self.verify)
        # the output rank's time for the call itself, without process start-up and loading
        run = out.pop(RUN_SECONDS, None)
        self.last_timing = {"run_seconds": float(run)} if run is not None else None
        missing = [s.name for s in self.output_specs if s.name not in out]
        if missing:
            raise ArtifactError(f"the ranks returned no {', '.join(missing)}", str(self.path))
        outputs = tuple(out[s.name] for s in self.output_specs)
        check_output_shapes(self.output_specs, outputs, values, f"the {self.nproc} ranks")
        return outputs


def partitioned_world(path: str | Path) -> int:
    """The world size an artifact was partitioned for (1 for a single-rank artifact)."""
    return world_size(read_manifest(Path(path)))


def load_partitioned(path: str | Path, verify: str = "full", timeout: float | None = None):
    """`runtime.load` for a partitioned artifact: this rank's part inside a torch.distributed
    job (a launcher set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), else a model that launches
    the ranks on this machine on each call. `timeout`: seconds a collective waits for its
    peers (None: DEFAULT_TIMEOUT)."""
    timeout = check_timeout(timeout)
    if all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return RankModel(path, verify=verify, timeout=timeout)
    # each rank hashes its own weight shards; the launching process reads sizes and headers
    return LaunchedModel(open_artifact(path, verify="size"), verify=verify, timeout=timeout)


def check_timeout(timeout: float | None) -> float:
    """A collective timeout in seconds: a positive finite number (None: the default)."""
    if timeout is None:
        return DEFAULT_TIMEOUT
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
            or not 0 < timeout < float("inf"):
        raise DayzeroError(f"timeout={timeout!r} is not a positive number of seconds",
                           "runtime.load(timeout=...)", "give the seconds a collective may wait "
                           f"for its peers, e.g. timeout=60 (default {DEFAULT_TIMEOUT:.0f})")
    return float(timeout)


if __name__ == "__main__":
    sys.exit(main())
