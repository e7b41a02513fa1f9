"""The TorchDynamo backend: each graph dynamo captures becomes a dayzero artifact.

Path of one graph: `graph_module.prepare` bakes the weights in and turns dynamo's SymInt inputs
into shape reads; the disk cache (`cache.py`) is looked up; on a miss `compiler.compile` runs
the usual frontend, passes and backend into the cache folder. When the frontend lacks ops, the
graph is partitioned (`partition.py`): the regions it supports are compiled, the rest runs in
eager, and one log line names the ops. Anything else that stops the compile is logged once and
the graph runs in eager: a torch.compile backend must never fail the user's program.
Inference only: a graph that would need a backward pass is refused with a clear message.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import fx

from compiler.errors import DayzeroError
from compiler.frontend import UnsupportedOpsError

from . import cache
from .graph_module import Prepared, output_examples, prepare
from .partition import compile_regions

log = logging.getLogger("dayzero.torch_compile")

_OPTION_KEYS = {"backend", "config", "passes", "backend_options", "cache", "cache_dir"}


@dataclass(frozen=True)
class Options:
    """`torch.compile(..., options={...})`: what `compiler.compile` takes, plus the cache."""
    backend: str = "onnxruntime"
    config: Any = None
    passes: str | None = None
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    cache: bool = True
    cache_dir: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, Any] | None) -> Options:
        options = dict(options or {})
        unknown = sorted(set(options) - _OPTION_KEYS)
        if unknown:
            raise DayzeroError(f"unknown torch.compile option(s) {', '.join(unknown)}",
                               "torch.compile(backend='dayzero', options=...)",
                               f"use {', '.join(sorted(_OPTION_KEYS))}")
        return cls(**options)

    def key(self) -> dict[str, Any]:
        return {"backend": self.backend, "config": self.config, "passes": self.passes,
                "backend_options": self.backend_options}


def dayzero_backend(gm: fx.GraphModule, example_inputs: list[Any],
                    options: Mapping[str, Any] | None = None, **_: Any) -> Callable:
    """What `torch.compile(model, backend="dayzero", options=...)` calls for each graph.

    The compile itself runs at the graph's first call, outside dynamo's frame compilation:
    torch.export traced inside it leaks its guards into the frame's (dynamo then rejects its
    own frame), and the first call has the real inputs at hand anyway."""
    opts = Options.parse(options)
    _refuse_training(example_inputs)
    return _FirstCallCompile(gm, example_inputs, opts)


class _FirstCallCompile:
    def __init__(self, gm: fx.GraphModule, example_inputs: list[Any], opts: Options):
        self.gm, self.example_inputs, self.opts = gm, example_inputs, opts
        self.run: Callable | None = None
        self.lock = threading.Lock()

    def __call__(self, *args: Any):
        if self.run is None:
            with self.lock:
                if self.run is None:
                    self.run = self._compile(list(args))
        if self.run is self.gm.forward:
            return self.run(*args)
        try:
            return self.run(*args)
        except DayzeroError as exc:  # refused inputs or a lowering bug: eager from now on
            log.warning("dayzero: a call failed, this graph runs in eager from now on: %s",
                        exc.what)
            self.run = self.gm.forward
            return self.run(*args)

    def _compile(self, args: list[Any]) -> Callable:
        gm = self.gm
        try:
            prepared = prepare(gm, [a if isinstance(a, torch.Tensor) else e
                                    for a, e in zip(args, self.example_inputs)])
            _check_outputs(gm)
            return _calling(_compile(prepared, self.opts), prepared)
        except DayzeroError as exc:
            log.warning("dayzero: this graph runs in eager, since %s", exc.what)
        except Exception as exc:  # a dayzero bug must not stop the user's program
            log.warning("dayzero: internal error, this graph runs in eager: %s: %s",
                        type(exc).__name__, exc)
        return gm.forward


def _refuse_training(example_inputs: list[Any]) -> None:
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                       for x in example_inputs):
        raise DayzeroError("dayzero's torch.compile backend is for inference only: gradients "
                           "are enabled and the graph has inputs that require them",
                           "torch.compile(backend='dayzero')",
                           "call the compiled model under torch.no_grad() or "
                           "torch.inference_mode(), or use backend='inductor' for training")


def _check_outputs(gm: fx.GraphModule) -> None:
    for value in output_examples(gm):
        if not isinstance(value, torch.Tensor):
            raise DayzeroError(f"the graph returns a {type(value).__name__}, not only tensors",
                               "torch.compile graph", "return tensors from forward")


def _compile(prepared: Prepared, opts: Options) -> Callable:
    try:
        return _artifact(prepared.module, prepared.example_inputs, prepared.dynamic_shapes, opts)
    except UnsupportedOpsError as exc:
        ops = set(exc.ops)
        module, compiled, eager = compile_regions(
            prepared, ops, lambda m, x, d, many: _artifact(m, x, d, opts, many))
        log.warning("dayzero: %s run in eager (no dayzero converter); %d region(s) compiled, "
                    "%d left in eager", ", ".join(sorted(ops)), compiled, eager)
        return module


def _artifact(module: torch.nn.Module, example_inputs: tuple, dynamic: tuple,
              opts: Options, returns_tuple: bool = True) -> torch.nn.Module:
    """The loaded artifact of `module`, from the disk cache or compiled into it."""
    import runtime
    from compiler.driver import compile as dayzero_compile

    sub = Prepared(module, list(range(len(example_inputs))), tuple(example_inputs), dynamic,
                   [t for t in module.state_dict().values()])
    path = cache.artifact_path(cache.cache_key(sub, opts.key()), opts.cache_dir)
    if opts.cache and path.is_dir():
        try:
            loaded = ArtifactModule(runtime.load(path), returns_tuple)
            log.info("dayzero: loaded %s from the cache", path)
            return loaded
        except DayzeroError as exc:
            log.warning("dayzero: recompiling the cached artifact %s: %s", path, exc.what)
    dynamic_shapes = dynamic if any(d is not None for d in dynamic) else None
    dayzero_compile(module, tuple(example_inputs), path, backend=opts.backend,
                    dynamic_shapes=dynamic_shapes, config=opts.config, passes=opts.passes,
                    backend_options=opts.backend_options, force=True)
    log.info("dayzero: compiled a graph of %d inputs into %s", len(example_inputs), path)
    return ArtifactModule(runtime.load(path), returns_tuple)


class ArtifactModule(torch.nn.Module):
    """A loaded artifact called with torch tensors: numpy in, torch tensors out on the first
    input's device."""

    def __init__(self, model: Any, returns_tuple: bool):
        super().__init__()
        self.model = model
        self.returns_tuple = returns_tuple

    def forward(self, *args: torch.Tensor):
        device = args[0].device if args else torch.device("cpu")
        outs = self.model(*[a.detach().cpu().numpy() for a in args])
        tensors = tuple(_tensor(o).to(device) for o in outs)
        return tensors if self.returns_tuple else tensors[0]


def _tensor(value: Any) -> torch.Tensor:
    """An output as a tensor: numpy arrays (most backends) are wrapped without a copy; the
    reference backend already returns tensors."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    return torch.from_numpy(np.asarray(value))


def _calling(runner: Callable, prepared: Prepared) -> Callable:
    positions = prepared.user_positions

    def run(*args: Any):
        with torch.no_grad():
            return tuple(runner(*[args[i] for i in positions]))
    return run
