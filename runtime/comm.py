"""Collectives over torch.distributed, with a timeout and a watchdog that names dead ranks.

torch.distributed (gloo on CPU) moves the tensors; this module adds what a user needs when a
rank goes away. Every collective runs under the process group's timeout, so a rank that hangs
cannot block the others forever; a rank that crashes closes its connections, which its peers
see at once. Either way the peers ask the `Watchdog` who is gone: each rank records a failure
message in the rendezvous store before it exits on an error, and bumps a heartbeat counter there
every second, so a rank killed outright shows up as a heartbeat that stopped. The surviving
ranks then exit with an error naming the rank, instead of hanging or printing a socket error.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from compiler.errors import DayzeroError
from compiler.ir.dtypes import DType

DEFAULT_TIMEOUT = 300.0  # seconds a collective may wait for its peers
HEARTBEAT = 1.0  # seconds between heartbeats
_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class RankFailure(DayzeroError):
    """A peer rank failed or stopped answering during a collective; `ranks` names the suspects."""

    def __init__(self, what: str, where: str | None, fix: str | None, ranks: list[int]):
        self.ranks = ranks
        super().__init__(what, where, fix)


@dataclass(frozen=True)
class Rendezvous:
    """Where this rank is: what torchrun (or any torch.distributed launcher) put in the env."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    agent_store: bool  # the launcher's agent hosts the store (torchrun); else rank 0 does

    @classmethod
    def from_env(cls) -> Rendezvous:
        missing = [k for k in _ENV if k not in os.environ]
        if missing:
            raise DayzeroError(f"not started by a torch.distributed launcher: {', '.join(missing)} "
                               "not set", "environment",
                               "use `dayzero run ARTIFACT --nproc N`, or torchrun (see "
                               "docs/parallel.md)")
        return cls(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                   os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                   os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True")


class Watchdog:
    """Heartbeats and failure notes in the rendezvous store, and the question "who is gone?"."""

    def __init__(self, env: Rendezvous, timeout: float):
        import torch.distributed as dist

        self.env, self.timeout = env, timeout
        self._client = lambda: dist.PrefixStore("dayzero/watch", dist.TCPStore(
            env.master_addr, env.master_port, is_master=False,
            timeout=timedelta(seconds=max(5.0, min(timeout, 30.0)))))
        self.store = self._client()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="dayzero-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        try:
            store = self._client()
            count = 0
            while not self._stop.is_set():
                store.set(f"beat/{self.env.rank}", str(count))
                count += 1
                self._stop.wait(HEARTBEAT)
        except Exception:  # the store went away (its host exited): nothing left to report to
            return

    def stop(self) -> None:
        self._stop.set()

    def fail(self, message: str) -> None:
        """Record why this rank is exiting, for the peers' error messages (best effort)."""
        try:
            self.store.set(f"failed/{self.env.rank}", message[:4000])
        except Exception:
            pass

    def suspects(self, peers: Sequence[int]) -> list[tuple[int, str]]:
        """(rank, what happened) for each peer that recorded a failure or stopped beating."""
        try:
            failed = self._failed(peers)
            if failed:
                return failed
            before = {p: self._count(p) for p in peers}
            time.sleep(3 * HEARTBEAT)
            stale = [(p, f"stopped responding (no heartbeat for {3 * HEARTBEAT:.0f}s)")
                     for p in peers if before[p] == self._count(p)]
            return self._failed(peers) or stale
        except Exception as exc:
            if self.env.agent_store:  # the launcher's agent hosted the store and reports itself
                return []
            return [(0, f"is unreachable, and so is the rendezvous store it hosts at "
                        f"{self.env.master_addr}:{self.env.master_port} ({type(exc).__name__})")]

    def _failed(self, peers: Sequence[int]) -> list[tuple[int, str]]:
        failed = []
        for p in peers:
            if self.store.check([f"failed/{p}"]):
                text = self.store.get(f"failed/{p}").decode().splitlines()[0]
                failed.append((p, "failed: " + text.removeprefix(f"rank {p}: ")))
        return failed

    def _count(self, peer: int) -> str | None:
        key = f"beat/{peer}"
        return self.store.get(key).decode() if self.store.check([key]) else None


class TorchCommunicator:
    """The collective ops' `Communicator` over torch.distributed process groups."""

    def __init__(self, env: Rendezvous, groups: dict[tuple[int, ...], Any], watchdog: Watchdog,
                 timeout: float):
        self.rank, self.env = env.rank, env
        self.groups, self.watchdog, self.timeout = groups, watchdog, timeout

    def all_reduce(self, x, group):
        import torch.distributed as dist

        t = x.contiguous().clone()
        self._guard("all_reduce", group, lambda: dist.all_reduce(t, group=self.groups[group]))
        return t

    def all_gather(self, x, dim, group):
        import torch
        import torch.distributed as dist

        t = x.contiguous()
        parts = [torch.empty_like(t) for _ in group]
        self._guard("all_gather", group,
                    lambda: dist.all_gather(parts, t, group=self.groups[group]))
        return torch.cat(parts, dim=dim)

    def reduce_scatter(self, x, dim, group):
        """gloo has no reduce-scatter: all-reduce, then keep this rank's chunk."""
        total = self.all_reduce(x, group)
        return total.chunk(len(group), dim=dim)[group.index(self.rank)].contiguous()

    def all_to_all(self, x, send_counts, recv_counts, group):
        """Rows with per-rank counts: gloo implements all_to_all_single with split sizes (the
        expert dispatch and combine of `expert_parallel`, compiler/ir/ops/expert_comm.py)."""
        import torch
        import torch.distributed as dist

        t = x.contiguous()
        out = torch.empty((int(sum(recv_counts)), *t.shape[1:]), dtype=t.dtype)
        self._guard("all_to_all", group, lambda: dist.all_to_all_single(
            out, t, [int(c) for c in recv_counts], [int(c) for c in send_counts],
            group=self.groups[group]))
        return out

    def send(self, x, peer, tag):
        import torch.distributed as dist

        self._guard("send", (self.rank, peer), lambda: dist.send(x.contiguous(), peer, tag=tag))

    def recv(self, shape, dtype: DType, peer, tag):
        import torch
        import torch.distributed as dist

        t = torch.empty([int(d) for d in shape], dtype=dtype.to_torch())
        self._guard("recv", (peer, self.rank), lambda: dist.recv(t, peer, tag=tag))
        return t

    def _guard(self, op: str, group: Sequence[int], call: Callable[[], Any]) -> None:
        try:
            call()
        except RuntimeError as exc:
            raise self.failure(op, group, exc) from None

    def failure(self, op: str, group: Sequence[int], exc: BaseException) -> RankFailure:
        """The error for a collective that raised: which peer is gone, and why if known."""
        peers = [r for r in group if r != self.rank]
        suspects = self.watchdog.suspects(peers)
        names = _ranks([r for r, _ in suspects] or peers)
        if suspects:
            what = "; ".join(f"rank {r} {reason}" for r, reason in suspects)
            fix = (f"fix what {names} reported (printed above) and run again"
                   if all(reason.startswith("failed") for _, reason in suspects) else
                   f"find out why {names} died (killed, out of memory, machine lost) and run "
                   "again")
        elif "timed out" in str(exc).lower() or "timeout" in str(exc).lower():
            what = (f"{names} did not take part in {op} within the collective timeout "
                    f"({self.timeout:.0f}s)")
            fix = (f"{names} is alive but stuck or much slower; if it is only slow, raise "
                   "--timeout")
        else:
            what = f"lost the connection to {names} during {op} ({str(exc).splitlines()[0]})"
            fix = f"see the output of {names} and run again"
        return RankFailure(f"rank {self.rank}: {what}", f"{op} over ranks {list(group)}", fix,
                           [r for r, _ in suspects] or peers)


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def connect(env: Rendezvous, groups: Sequence[Sequence[int]], timeout: float,
            backend: str = "gloo") -> TorchCommunicator:
    """Join the process group, make every mesh group (in the same order on every rank)."""
    import torch.distributed as dist

    delta = timedelta(seconds=timeout)
    try:
        store = dist.TCPStore(env.master_addr, env.master_port, env.world_size,
                              is_master=env.rank == 0 and not env.agent_store, timeout=delta,
                              wait_for_workers=False)
        dist.init_process_group(backend, store=dist.PrefixStore("dayzero/pg", store),
                                rank=env.rank, world_size=env.world_size, timeout=delta)
    except RuntimeError as exc:
        raise DayzeroError(f"rank {env.rank}: could not join the {env.world_size} ranks within "
                           f"{timeout:.0f}s: {str(exc).splitlines()[0]}",
                           f"rendezvous at {env.master_addr}:{env.master_port}",
                           "start every rank with the same MASTER_ADDR and MASTER_PORT (torchrun "
                           "does), and check that they can reach it") from None
    table = {}
    for ranks in groups:
        key = tuple(int(r) for r in ranks)
        if key not in table:
            table[key] = dist.new_group(list(key), timeout=delta)
    return TorchCommunicator(env, table, Watchdog(env, timeout), timeout)


def barrier(comm: TorchCommunicator, what: str) -> None:
    """All ranks reach this point, or an error naming the ranks that did not."""
    import torch.distributed as dist

    try:
        dist.barrier()
    except RuntimeError as exc:
        raise comm.failure(what, list(range(comm.env.world_size)), exc) from None
