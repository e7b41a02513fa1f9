"""A checkpoint ready to compile: the meta model to export, and the binding of its graph's weights.

`Checkpoint.bind(graph)` replaces the meta tensors the exported graph carries with lazy handles
onto the checkpoint's shards (or the real buffers the model computed when it was built), renames
tied weights to the name the checkpoint stores them under, and orders the weights by shard and
offset so that the artifact writer reads each shard front to back. `Checkpoint.streaming(log)`
wraps the write: a progress bar over bytes that names the shard being read, then the summary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from compiler.ir import Graph
from compiler.log import StageLog

from .layout import CheckpointError, CheckpointLayout
from .lazy import ShardReader
from .verify import Binding

if TYPE_CHECKING:
    from .build import BuiltModel


@dataclass
class Checkpoint:
    layout: CheckpointLayout
    model: BuiltModel
    binding: Binding
    reader: ShardReader

    @property
    def module(self):
        return self.model.module

    @property
    def example_inputs(self) -> tuple:
        return self.model.example_inputs

    @property
    def dynamic_shapes(self) -> Any:
        return self.model.dynamic_shapes

    def describe(self) -> str:
        lo, hi = self.model.seq_range
        shards = f"{len(self.layout.files)} shard(s)" if self.layout.index else "1 file"
        return (f"{self.model.architecture} from {self.layout.root}: {len(self.layout.tensors)} "
                f"tensors, {self.layout.total_bytes / 2**30:.2f} GiB in {shards}; input_ids "
                f"[{self.example_inputs[0].shape[0]}, seq], seq in [{lo}, {hi}]")

    def bind(self, graph: Graph, log: StageLog | None = None) -> Graph:
        """Point `graph`'s weights at the checkpoint (lazily); returns the same graph."""
        bound, other = [], []
        for name, value in list(graph.weights.items()):
            record = self.binding.record_for(name)
            group = self.binding.converted.get(name)
            if record is not None:
                _check_type(value, record.shape, name, f"{record.dtype}{list(record.shape)} in "
                            f"{record.file}", f"tensor '{record.name}' in {record.file}")
                bound.append((record, value, self.reader.handle(record, value.type.dtype),
                              record.name))
            elif group is not None:
                first = group.records[0]
                _check_type(value, group.outputs[name], name,
                            f"{group.dtype}{list(group.outputs[name])} {group.describe()}",
                            f"tensor '{first.name}' in {first.file}")
                handle = group.handle(name, self.reader, value.type.dtype, self.binding.rules)
                bound.append((first, value, handle, value.name))
            else:
                other.append((value, self._computed(graph, name)))
        order = {f: i for i, f in enumerate(self.layout.files)}
        bound.sort(key=lambda item: (order[item[0].file], item[0].begin))
        taken = {value.name for _, value, _, _ in bound} | {value.name for value, _ in other}
        weights, data = {}, {}
        for _, value, handle, stored in bound:
            if stored != value.name and stored not in taken:
                value.name = stored  # a tied weight, under the name the checkpoint uses
            weights[value.name], data[value.name] = value, handle
        for value, tensor in other:
            weights[value.name], data[value.name] = value, tensor
        graph.weights, graph.weight_data = weights, data
        if log is not None:
            for note in self.binding.notes:
                log.line(f"  note: {note}")
        return graph

    def _computed(self, graph: Graph, name: str) -> Any:
        """Data of a weight the checkpoint does not hold: a buffer the model computed, or a
        constant torch.export lifted out of forward()."""
        if name in self.model.buffers:
            return self.model.buffers[name]
        data = graph.weight_data.get(name)
        if data is None or getattr(data, "device", None) is not None and data.device.type == "meta":
            raise CheckpointError(f"weight '{name}' of the exported {self.model.architecture} "
                                  "has no data: it is not in the checkpoint and the model does "
                                  "not compute it", str(self.layout.root),
                                  "report this model: its forward creates a tensor on the "
                                  "device of its inputs that dayzero cannot recover")
        return data

    @contextlib.contextmanager
    def streaming(self, log: StageLog) -> Iterator[Callable[[int], Any]]:
        """Yields a progress factory (total bytes -> callback) for the write; prints a summary."""
        bars = []

        def progress(total: int):
            if not log.progress_enabled:
                self.reader.on_shard = lambda i, n, f: log.line(f"  reading shard {i}/{n}: {f}")
                return None
            from tqdm import tqdm

            bar = tqdm(total=total, desc="weights", unit="B", unit_scale=True, file=log.stream,
                       leave=False)
            bars.append(bar)
            self.reader.on_shard = lambda i, n, f: bar.set_postfix_str(f"shard {i}/{n} {f}")
            return bar.update

        try:
            yield progress
            log.line("  " + self.reader.stats.summary(len(self.layout.files)))
        finally:
            for bar in bars:
                bar.close()
            self.reader.on_shard = None
            self.reader.close()


def _check_type(value, shape, name: str, stored: str, where: str) -> None:
    if tuple(value.type.shape) != tuple(shape):
        raise CheckpointError(f"weight '{name}' is {value.type} in the exported graph but "
                              f"{stored}", where,
                              "use the config.json that belongs to these weights")
