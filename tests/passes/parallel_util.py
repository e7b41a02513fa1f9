"""Run every rank of a partitioned program in one process, one thread per rank.

`ThreadWorld` implements the collective ops' `Communicator` with shared memory, so pass tests
check partitioned numerics in milliseconds; the gloo tests under tests/runtime check the real
launcher and transport.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from compiler.ir.ops.collective import bind_communicator


class ThreadWorld:
    def __init__(self, size: int, timeout: float = 30.0):
        self.size = size
        self.timeout = timeout
        self.cond = threading.Condition()
        self.slots: dict[tuple, dict[int, Any]] = {}
        self.mail: dict[tuple[int, int, int], Any] = {}

    def exchange(self, rank: int, group: tuple[int, ...], seq: int, value) -> list:
        key = (group, seq)
        with self.cond:
            self.slots.setdefault(key, {})[rank] = value
            self.cond.notify_all()
            ok = self.cond.wait_for(lambda: len(self.slots[key]) == len(group), self.timeout)
            if not ok:
                raise TimeoutError(f"rank {rank}: group {group} step {seq} timed out")
            return [self.slots[key][r] for r in group]

    def post(self, key, value) -> None:
        with self.cond:
            self.mail[key] = value
            self.cond.notify_all()

    def take(self, key):
        with self.cond:
            if not self.cond.wait_for(lambda: key in self.mail, self.timeout):
                raise TimeoutError(f"recv {key} timed out")
            return self.mail.pop(key)


class ThreadComm:
    def __init__(self, world: ThreadWorld, rank: int):
        self.world, self.rank = world, rank
        self.seq: dict[tuple[int, ...], int] = {}

    def _gather(self, x, group):
        seq = self.seq.get(group, 0)
        self.seq[group] = seq + 1
        value = [c.clone() for c in x] if isinstance(x, list) else x.clone()
        return self.world.exchange(self.rank, group, seq, value)

    def all_reduce(self, x, group):
        parts = self._gather(x, group)
        total = parts[0].clone()
        for p in parts[1:]:
            total += p
        return total

    def all_gather(self, x, dim, group):
        return torch.cat(self._gather(x, group), dim=dim)

    def reduce_scatter(self, x, dim, group):
        total = self.all_reduce(x, group)
        return total.chunk(len(group), dim=dim)[group.index(self.rank)].contiguous()

    def all_to_all(self, x, send_counts, recv_counts, group):
        chunks = list(torch.split(x, [int(c) for c in send_counts]))
        every = self._gather(chunks, group)  # every rank's list of chunks, by group position
        mine = group.index(self.rank)
        got = [every[i][mine] for i in range(len(group))]
        assert [len(c) for c in got] == [int(c) for c in recv_counts], (got, recv_counts)
        return torch.cat(got, 0)

    def send(self, x, peer, tag):
        self.world.post((self.rank, peer, tag), x.clone())

    def recv(self, shape, dtype, peer, tag):
        x = self.world.take((peer, self.rank, tag))
        assert list(x.shape) == list(shape) and x.dtype == dtype.to_torch(), (x.shape, shape)
        return x


def run_ranks(size: int, fn: Callable[[int], Any]) -> list:
    """fn(rank) on `size` threads, each with its communicator bound; results by rank."""
    world = ThreadWorld(size)
    results: list = [None] * size
    errors: list = []

    def body(rank):
        try:
            with bind_communicator(ThreadComm(world, rank)):
                results[rank] = fn(rank)
        except BaseException as exc:  # surfaced in the main thread below
            errors.append((rank, exc))

    threads = [threading.Thread(target=body, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        rank, exc = errors[0]
        raise RuntimeError(f"rank {rank} failed: {exc!r}") from exc
    return results


def run_rank_graphs(graphs: Sequence, inputs: Sequence) -> list:
    """Outputs of every rank's graph (the reference interpreter, weights from weight_data)."""
    from backends.reference.interpreter import run_graph

    return run_ranks(len(graphs), lambda r: run_graph(graphs[r], graphs[r].weight_data, inputs))


def run_rank_programs(graphs: Sequence, inputs: Sequence) -> list:
    """Like `run_rank_graphs`, but each rank's graph runs as the runtime runs it: compute
    segments (here on the reference interpreter, each binding its own size symbols, such as the
    rows an expert dispatch received) and communication ops in between (runtime/rank_exec.py)."""
    from backends.reference.interpreter import bind_symbols, run_graph
    from runtime.rank_exec import _communicate
    from runtime.segments import split_steps

    def rank(r: int):
        graph = graphs[r]
        bindings = bind_symbols(graph, [x.shape for x in inputs])
        env = {id(v): torch.as_tensor(x) for v, x in zip(graph.inputs, inputs)}
        for step in split_steps(graph):
            if step.is_compute:
                args = list(inputs) + [env[id(v)] for v in step.reads]
                results = run_graph(step.graph, graph.weight_data, args)
                env.update({id(v): t for v, t in zip(step.writes, results)})
            else:
                results = _communicate(step.node, env, bindings)
                results = results if len(step.node.outputs) > 1 else (results,)
                env.update({id(v): t for v, t in zip(step.node.outputs, results)})
        return [env[id(v)] for v in graph.outputs]

    return run_ranks(len(graphs), rank)


# -- the Llama example, exported once per test process ------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
LLAMA = f"{ROOT}/examples/llama.py:build"


@functools.cache
def _llama(batch: int):
    """(IR text after the default pipeline, weights, input_ids, eager logits)."""
    from compiler import export
    from compiler.ir import print_ir
    from compiler.spec import load_spec
    from passes import DEFAULT_PIPELINE, PassManager

    spec = load_spec(LLAMA)
    ids = spec.example_inputs[0]
    if batch != ids.shape[0]:
        gen = torch.Generator().manual_seed(7)
        ids = torch.randint(0, 256, (batch, ids.shape[1]), generator=gen)
    graph = PassManager(DEFAULT_PIPELINE).run(export(spec.module, (ids,), spec.dynamic_shapes))
    with torch.no_grad():
        expected = spec.module(ids)
    weights = {k: torch.as_tensor(v).clone() for k, v in graph.weight_data.items()}
    return print_ir(graph), weights, ids, expected


def llama_graph(batch: int = 1):
    """A fresh IR graph of examples/llama.py (with weights), its input ids and eager logits."""
    from compiler.ir import parse_ir

    text, weights, ids, expected = _llama(batch)
    graph = parse_ir(text)
    graph.weight_data.update(weights)
    return graph, ids, expected
