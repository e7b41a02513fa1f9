"""Running a plan: launch generated kernels, run host ops, keep intermediates in the arena.

Kernels are compiled from the regenerated source in memory and written to a per-user cache
folder (`cache_dir`, 0700) as k_<sha256>.py, so tracebacks and Triton's `jit` (which reads a
function's source through `inspect`) see a file; what runs is always the verified text, never
what the file holds.
With a memory plan (`memory_plan` in the manifest), every value the plan gives a buffer of its
own lives in one arena allocated per run: kernels write their outputs straight into their slot,
host-op results are copied into theirs (a view the plan did not expect, such as a permute, must
not keep pointing at a buffer the plan reuses). Values the plan places inside another value's
buffer are left where the op put them, which costs memory, never correctness.

GEMM kernels (`matmul.py`) get their block sizes from the executable's own `Autotuner`: timed
candidates on CUDA, the shape heuristic under the interpreter. A GEMM whose output slot overlaps
one of its operands (the plan may hand an epilogue output the slot of an operand that dies at
the matmul) writes into a scratch tensor first, since its tiles read operands other tiles write.
"""

from __future__ import annotations

import linecache
import os
import tempfile
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from compiler.errors import ArtifactError, InputError
from compiler.ir import Graph, get_op, symbolic
from compiler.ir.ops.registry import META_ATTRS

from ..user_cache import user_cache_dir
from . import matmul
from .autotune import Autotuner
from .plan import LaunchStep, sha256

_MAX_BLOCK = 1024


def cache_dir(override: str | os.PathLike | None = None) -> Path:
    """The per-user folder kernel modules are written to (see backends/user_cache.py)."""
    return user_cache_dir("triton", override)


def import_kernels(source: str, cache: str | os.PathLike | None = None) -> Any:
    """The module of `source`, written to the kernel cache (`cache_dir`) as k_<sha256>.py.

    The module is compiled from `source` in memory, never from what the file holds: the file
    exists because Triton's `jit` reads a kernel's source through `inspect`, which is served
    from `linecache`, filled here with the same verified text. The file is rewritten atomically
    whenever it differs, so a reader of the cache never sees a half-written module.
    """
    digest = sha256(source)
    folder = cache_dir(cache)
    path = folder / f"k_{digest}.py"
    data = source.encode()
    try:
        current = path.read_bytes() if path.is_file() else None
    except OSError:
        current = None
    if current != data:
        fd, tmp = tempfile.mkstemp(prefix=f".k_{digest}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    filename = str(path)
    code = compile(source, filename, "exec", dont_inherit=True)
    name = f"dayzero_triton_k_{digest}"
    module = types.ModuleType(name)
    module.__file__ = filename
    # mtime None: linecache never re-checks (or re-reads) the file for this entry
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    # `source` is what this package's code generator produced from the verified graph at this
    # load (backends/triton/__init__.py regenerates it and runs source_guard.check_source on it
    # first); no text of the artifact is executed
    exec(code, module.__dict__)
    return module


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


class TritonExecutable:
    """Inputs in graph order -> outputs in graph order (numpy arrays)."""

    def __init__(self, graph: Graph, weights: Mapping[str, Any], steps: list[LaunchStep],
                 module: Any, device: str, fallbacks: Sequence[tuple[Any, Any]] = (),
                 slots: Mapping[str, tuple[int, int]] | None = None, arena_bytes: int = 0):
        import torch

        self.graph, self.steps, self.module, self.device = graph, steps, module, device
        self.weights = {name: torch.as_tensor(t).to(device) for name, t in weights.items()}
        self.values = {v.name: v for v in graph.values()}
        self.fallbacks = list(fallbacks)  # (segment with .inputs/.outputs, executable)
        self.slots, self.arena_bytes = dict(slots or {}), arena_bytes
        self.arena = None
        self.returned = {v.name for v in graph.outputs}
        self.tuner = Autotuner(enabled=device == "cuda")
        self.handlers = {"kernel": self._launch, "matmul": self._launch_matmul,
                         "segment": self._fallback, "host": self._host}

    def __call__(self, inputs: Sequence[Any]) -> list[Any]:
        return [t.detach().cpu().numpy() for t in self.run_tensors(inputs)]

    def run_tensors(self, inputs: Sequence[Any]) -> list[Any]:
        """Like calling it, but outputs stay torch tensors on the device (no host copy)."""
        import torch

        if len(inputs) != len(self.graph.inputs):
            raise InputError(f"expected {len(self.graph.inputs)} inputs, got {len(inputs)}")
        env = {v.name: torch.as_tensor(x).to(self.device)
               for v, x in zip(self.graph.inputs, inputs)}
        env.update(self.weights)
        bindings = _bind(self.graph, env)
        self.arena = torch.empty(self.arena_bytes, dtype=torch.uint8, device=self.device) \
            if self.slots else None
        # Triton's interpreter computes with numpy, which warns on log(0), 1/0 and 0/0 where torch
        # and a GPU are silent: the values (Inf, NaN) are the same, the warnings only noise.
        with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
            for step in self.steps:
                self.handlers[step.kind](step, env, bindings)
        self.arena = None
        return [env[v.name] for v in self.graph.outputs]

    def _alloc(self, name: str, shape: list[int]) -> Any:
        import torch

        dtype = self.values[name].dtype.to_torch()
        if self.arena is not None and name in self.slots:
            offset, size = self.slots[name]
            nbytes = torch.Size(shape).numel() * dtype.itemsize
            if nbytes > size:
                raise InputError(f"%{name} needs {nbytes} bytes but its arena slot holds {size}: "
                                 "the inputs are larger than the sizes the memory plan was made "
                                 "for", f"value %{name}", "recompile with plan_memory at larger "
                                 "sizes (the default plans every symbol at its upper bound)")
            return self.arena[offset:offset + nbytes].view(dtype).view(shape)
        return torch.empty(shape, dtype=dtype, device=self.device)

    def _launch(self, step: LaunchStep, env: dict, bindings: Mapping[str, int]) -> None:
        import torch

        kernel = step.kernel
        domain = [_sized(symbolic.evaluate, d, bindings) for d in kernel.domain]
        ins = [env[name] for name in kernel.inputs]
        if kernel.perm:
            ins[0] = ins[0].permute(kernel.perm)
        outs = []
        for name in kernel.outputs:
            shape = [_sized(symbolic.evaluate, d, bindings) for d in self.values[name].shape]
            if kernel.unpermute:
                shape = [shape[p] for p in kernel.perm]
            outs.append(self._alloc(name, shape))
        # an output slot the memory plan laid over an input at another offset (the input died
        # inside the fused group): programs would overwrite elements others have yet to read
        targets = [torch.empty_like(o) if any(_clobbers(o, t, kernel.reduced) for t in ins)
                   else o for o in outs]
        strides = [s for t in ins for s in t.expand(domain).stride()]
        total, rows = 1, 1
        for i, d in enumerate(domain):
            total *= d
            rows *= d if i < len(domain) - kernel.reduced else 1
        if total or (kernel.reduced and rows):  # an empty row still reduces (to 0, nan, ...)
            if kernel.reduced:
                count = total // rows
                grid, block = (rows,), _next_pow2(count)
            else:
                count = total
                block = min(_MAX_BLOCK, _next_pow2(total))
                grid = (-(-total // block),)
            fn = getattr(self.module, kernel.name)
            fn[grid](*ins, *targets, *domain, *strides, count, BLOCK=block)
        for out, target in zip(outs, targets):
            if target is not out:
                out.copy_(target)
        if kernel.unpermute:
            inverse = sorted(range(len(kernel.perm)), key=kernel.perm.__getitem__)
            outs = [t.permute(inverse) for t in outs]
        env.update(zip(kernel.outputs, outs))

    def _launch_matmul(self, step: LaunchStep, env: dict, bindings: Mapping[str, int]) -> None:
        import torch

        kernel = step.kernel
        ins = [env[name] for name in kernel.inputs]
        shape = [_sized(symbolic.evaluate, d, bindings) for d in kernel.shape]
        outs = [self._alloc(name, shape) for name in kernel.outputs]
        targets = [torch.empty_like(o) if any(_overlap(o, t) for t in ins) else o for o in outs]
        fn = getattr(self.module, kernel.name)
        interpreted = self.device != "cuda"
        prepared = matmul.prepare(kernel, ins, targets, interpreted)
        if not prepared.empty:
            def trial(config) -> None:  # timed on scratch outputs: an epilogue may be in place
                scratch = [torch.empty_like(o) for o in outs]
                matmul.launch(fn, matmul.prepare(kernel, ins, scratch, interpreted), config)

            config = self.tuner.choose(kernel.name, prepared.sizes, trial,
                                       kernel.dtype.itemsize)
            matmul.launch(fn, prepared, config)
        for out, target in zip(outs, targets):
            if target is not out:
                out.copy_(target)
        env.update(zip(kernel.outputs, outs))

    def _fallback(self, step: LaunchStep, env: dict, bindings: Mapping[str, int]) -> None:
        """Run a fallback segment; CPU tensors cross as numpy views of the same memory."""
        import torch

        segment, run = self.fallbacks[step.segment]
        results = run([env[name].detach().cpu() for name in segment.inputs])
        for name, array in zip(segment.outputs, results):
            env[name] = torch.from_numpy(array).to(self.device)

    def _host(self, step: LaunchStep, env: dict, bindings: Mapping[str, int]) -> None:
        node = step.node
        args = [None if v is None else env[v.name] for v in node.inputs]
        attrs = {k: _sized(symbolic.resolve, v, bindings) for k, v in node.attrs.items()
                 if k not in META_ATTRS}
        if node.op == "scaled_dot_product_attention":
            from .attention import attention, supported

            if supported(*args[:3], softcap=attrs["softcap"]):
                results = (attention(*args, **attrs),)
                return self._store(node, results, env)
        if node.op == "paged_attention":
            from . import paged

            if paged.supported(*args[:6], **attrs):
                return self._store(node, paged.paged_attention(*args, **attrs), env)
        if node.op == "grouped_matmul":
            from . import grouped

            if grouped.supported(*args):
                return self._store(node, (grouped.grouped_matmul(*args),), env)
        result = get_op(node.op).reference(*args, **attrs)
        results = tuple(result) if isinstance(result, (tuple, list)) else (result,)
        self._store(node, results, env)

    def _store(self, node, results: tuple, env: dict) -> None:
        for value, tensor in zip(node.outputs, results):
            if self.arena is not None and value.name in self.slots:
                slot = self._alloc(value.name, list(tensor.shape))
                slot.copy_(tensor)
                tensor = slot
            elif self.arena is not None and value.name in self.returned and \
                    _overlap(tensor, self.arena):
                # a returned view of an arena value (the memory plan keeps outputs out of the
                # arena and expects them copied out): later steps reuse the bytes it views
                tensor = tensor.clone()
            env[value.name] = tensor


def _clobbers(out: Any, inp: Any, reduced: int) -> bool:
    """Whether writing `out` may overwrite elements of `inp` another program still reads.
    Exactly in place (same address and layout) is safe for an elementwise kernel: each program
    reads its elements before writing them; a row kernel writes fewer elements than it reads."""
    if not _overlap(out, inp):
        return False
    same = (out.data_ptr() == inp.data_ptr() and out.shape == inp.shape
            and out.stride() == inp.stride())
    return reduced > 0 or not same


def _overlap(a: Any, b: Any) -> bool:
    """Whether two tensors' byte ranges intersect (by address: arena slots share a storage)."""
    if a.numel() == 0 or b.numel() == 0:
        return False

    def span(t: Any) -> tuple[int, int]:
        extent = sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride()))
        return t.data_ptr(), t.data_ptr() + (extent + 1) * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def _sized(fn: Any, value: Any, bindings: Mapping[str, int]) -> Any:
    """`fn(value, bindings)` (symbolic.evaluate or resolve); a size symbol no input dim binds
    (graph.dzir declared it and used it in an attribute or a type) is the artifact's fault."""
    try:
        return fn(value, bindings)
    except KeyError as exc:
        raise ArtifactError(f"{exc.args[0] if exc.args else exc}: no input dim gives it a "
                            "value", "graph.dzir", "the artifact's graph is inconsistent; "
                            "recompile the model") from None


def _bind(graph: Graph, env: Mapping[str, Any]) -> dict[str, int]:
    import sympy

    bindings: dict[str, int] = {}
    for value in graph.inputs:
        for dim, size in zip(value.type.shape, env[value.name].shape):
            if isinstance(dim, sympy.Symbol):
                bindings.setdefault(dim.name, int(size))
    return bindings


