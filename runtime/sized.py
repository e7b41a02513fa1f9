"""An artifact compiled at several static sizes of one dim: run the one the inputs fit.

The compiler writes it when torch.export can only trace a dim as a constant (a recurrent scan
unrolled over the sequence; see compiler/static_sizes.py): the top folder is the artifact for
one size, `sizes/<dim>-<n>/` the others, and the manifest's `static_sizes` section lists them
with the (input position, axis) pairs that carry the dim. Where the compiler checked that
right-padding leaves earlier positions' outputs unchanged (`static_sizes.padding`: the [output,
axis] pairs that carry the dim), a size between the compiled ones runs at the next compiled
size, the inputs padded on the right (with their own leading values) and the outputs cut back;
otherwise only exact sizes run and any other size is refused with the sizes compiled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from compiler.errors import ArtifactError, InputError

from .artifact import open_artifact


class SizedModel:
    """Call it like a CompiledModel; it runs the size's artifact (each loaded on first use)."""

    def __init__(self, top, verify: str, session: Mapping[str, Any] | None, loader):
        self._top, self._verify, self._session, self._loader = top, verify, session, loader
        entry = top.manifest["static_sizes"]
        self.dim: str = entry.get("dim", "?")
        if not isinstance(self.dim, str) or not 0 < len(self.dim) <= 64:
            raise ArtifactError("manifest.json: static_sizes.dim is not a name",
                                f"{top.path}: static_sizes.dim",
                                "the artifact is corrupted; recompile it")
        self._axes = _pairs(entry.get("inputs"), top.path, top.input_specs)
        self._paths = _sizes(entry.get("sizes"), top.path)
        self._cut = _padding(entry.get("padding"), top.path)  # None: exact sizes only
        self._loaded: dict[int, Any] = {}
        self.input_specs, self.output_specs = top.input_specs, top.output_specs

    @property
    def sizes(self) -> list[int]:
        """The sizes of the dim compiled into this artifact."""
        return sorted(self._paths)

    @property
    def path(self):
        return self._top.path

    @property
    def manifest(self) -> dict[str, Any]:
        return self._top.manifest

    def __repr__(self) -> str:
        return f"SizedModel({str(self.path)!r}, {self.dim} in {self.sizes})"

    def __getattr__(self, name: str) -> Any:
        """Anything else (backend, artifact, describe) is the top size's model's."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._top, name)

    def __call__(self, *inputs: Any) -> tuple[np.ndarray, ...]:
        size = self._size_of(inputs)
        if size in self._paths or self._cut is None:
            return self.model_for(size)(*inputs)
        target = min((n for n in self._paths if n > size), default=None)
        if target is None:
            raise InputError(f"{self.dim} = {size}: this artifact runs {self.dim} up to "
                             f"{max(self._paths)} (sizes {', '.join(map(str, self.sizes))}, "
                             "smaller ones padded to the next)", str(self.path),
                             f"pass at most {max(self._paths)}, or recompile with static_sizes "
                             f"including {size}")
        outputs = list(self.model_for(target)(*self._padded(inputs, target)))
        for index, axis in self._cut:
            if index < len(outputs) and axis < np.ndim(outputs[index]):
                outputs[index] = np.take(outputs[index], np.arange(size), axis=axis)
        return tuple(outputs)

    def _padded(self, inputs: tuple, target: int) -> list:
        """The inputs with the dim padded on the right to `target`, repeating their values."""
        out = list(inputs)
        for position, axis in self._axes:
            x = np.asarray(out[position])
            have = x.shape[axis]
            out[position] = np.take(x, np.arange(target) % have, axis=axis)
        return out

    def model_for(self, size: int):
        """The CompiledModel for `size` of the dim (an InputError if it was not compiled)."""
        if size not in self._paths:
            raise InputError(f"{self.dim} = {size}: this artifact runs {self.dim} = "
                             f"{', '.join(map(str, self.sizes))} only (the model has no graph "
                             f"dynamic in {self.dim}, and padding changes its outputs)",
                             str(self.path), f"pass inputs whose {self.dim} is one of "
                             f"{self.sizes}, or recompile with static_sizes including {size}")
        if size not in self._loaded:
            rel = self._paths[size]
            model = self._top if rel == "." else self._loader(
                open_artifact(self.path / rel, verify=self._verify), self._session)
            self._check_size(model, size, rel)
            self._loaded[size] = model
        return self._loaded[size]

    def _check_size(self, model, size: int, rel: str) -> None:
        """The size's artifact takes `size` at every (input, axis) that carries the dim: the
        manifest's list of sizes is checked against each artifact it names."""
        for position, axis in self._axes:
            specs = model.input_specs
            dim = specs[position].shape[axis] if position < len(specs) and \
                axis < len(specs[position].shape) else None
            if dim != size:
                raise ArtifactError(
                    f"the artifact is inconsistent: manifest.json static_sizes lists {rel} for "
                    f"{self.dim} = {size}, but its input {position} has {dim} at axis {axis}",
                    f"{self.path}/manifest.json: static_sizes.sizes",
                    "recompile the artifact: it was edited or corrupted after it was written")

    def _size_of(self, inputs: tuple) -> int:
        found = set()
        for position, axis in self._axes:
            if position >= len(inputs):
                continue  # the count is checked by the size's model, with its own message
            shape = np.shape(inputs[position])
            if axis < len(shape):
                found.add(int(shape[axis]))
        if len(found) != 1:
            where = ", ".join(f"input {p} axis {a}" for p, a in self._axes)
            raise InputError(f"{self.dim} must have one size in every input that carries it "
                             f"({where}), got {sorted(found) or 'none'}", str(self.path),
                             f"give {where} the same size, one of {self.sizes}")
        return found.pop()


def _is_pairs(entry: Any, bound: int | None = None) -> bool:
    """Whether `entry` is a list of [int, int] pairs of non-negative ints (below `bound`)."""
    return isinstance(entry, list) and all(
        isinstance(p, list) and len(p) == 2 and all(
            type(x) is int and x >= 0 and (bound is None or x < bound) for x in p)
        for p in entry)


def _pairs(entry: Any, root, specs) -> list[tuple[int, int]]:
    """[input, axis] pairs, each an axis of an input of the model (a pair past them made the
    padding index an axis the input does not have)."""
    if not (entry and _is_pairs(entry)) or not all(
            p[0] < len(specs) and p[1] < len(specs[p[0]].shape) for p in entry):
        raise ArtifactError("manifest.json: static_sizes.inputs is not a list of [input, axis] "
                            "of the model's inputs", f"{root}: static_sizes",
                            "the artifact is corrupted; recompile it")
    return [(p[0], p[1]) for p in entry]


def _padding(entry: Any, root) -> list[tuple[int, int]] | None:
    if entry is None:
        return None
    outputs = entry.get("outputs") if isinstance(entry, dict) else None
    if not (isinstance(entry, dict) and entry.get("side") == "right"
            and _is_pairs(outputs, bound=64)):
        raise ArtifactError("manifest.json: static_sizes.padding is not {side: right, outputs: "
                            "[[output, axis], ...]}", f"{root}: static_sizes",
                            "the artifact is corrupted; recompile it")
    return [(p[0], p[1]) for p in outputs]


def _sizes(entry: Any, root) -> dict[int, str]:
    ok = isinstance(entry, list) and entry and all(
        isinstance(e, dict) and type(e.get("size")) is int and isinstance(e.get("path"), str)
        and (e["path"] == "." or _inside(e["path"])) for e in entry)
    if not ok:
        raise ArtifactError("manifest.json: static_sizes.sizes is not a list of {size, path} "
                            "inside the artifact", f"{root}: static_sizes",
                            "the artifact is corrupted; recompile it")
    return {e["size"]: e["path"] for e in entry}


def _inside(rel: str) -> bool:
    parts = rel.split("/")
    return not rel.startswith("/") and all(p not in ("", ".", "..") for p in parts)
