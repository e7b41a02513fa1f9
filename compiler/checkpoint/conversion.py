"""Parameters transformers assembles on load from other checkpoint tensors, found with its own
conversion mapping, checked on headers, and bound to lazy handles.

transformers 5 stacks a mixture of experts' weights into one parameter per projection
(`mlp.experts.gate_up_proj` [experts, 2 * inter, hidden], `mlp.experts.down_proj`), while the
Hub's checkpoints store one tensor per expert (`block_sparse_moe.experts.3.w1.weight`, or
`mlp.experts.3.gate_proj.weight`), and `save_pretrained` writes that layout too (it reverts the
conversion). Which checkpoint names make which parameter, and by which operations, is
transformers' table (`transformers.conversion_mapping.get_model_conversion_mapping`: renamings,
then at most one `WeightConverter` per name); this module reuses it rather than naming tensors
per model, and gives each converted parameter a lazy handle (`lazy_converted`): a streamed
stack where the operations only lay the parts one after the other, else transformers' own
operations on that parameter's sources.

Every part is checked before any byte is read: one tensor per expert numbered 0..E-1 for each
source name, the same shape and dtype throughout, and the result's shape (transformers'
operations run on meta tensors) against the model's parameter.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from compiler.ir import DType

from .layout import CheckpointLayout, TensorRecord

Problem = tuple[str, TensorRecord | None]  # text, the tensor it names (for the error's place)


@dataclass
class ConversionRules:
    """transformers' load-time renamings and converters for one model (built on meta)."""

    model: Any
    renamings: list
    converters: list
    prefix: str

    def target(self, name: str, expected: Mapping[str, Any]) -> tuple[str, Any, str] | None:
        """(parameter, converter, matched source pattern) for a checkpoint name that a
        converter turns into a parameter of the model, else None."""
        from transformers.core_model_loading import rename_source_key

        renamed, pattern = rename_source_key(name, self.renamings, self.converters, self.prefix,
                                             expected)
        if pattern is None or renamed not in expected:
            return None
        converter = next(c for c in self.converters if pattern in c.source_patterns)
        return renamed, converter, pattern

    def renamed(self, name: str) -> str:
        """The name after the renamings only: what the converter's patterns are matched on."""
        from transformers.core_model_loading import apply_renamings

        return apply_renamings(name, self.renamings)


def conversion_rules(model) -> ConversionRules | None:
    """The converters transformers applies to `model`'s checkpoints, or None (none, or an
    older transformers without the table)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming
        rules = get_model_conversion_mapping(model)
    except Exception:  # an older transformers, or a model it has no mapping for
        return None
    converters = [r for r in rules if isinstance(r, WeightConverter)]
    if not converters:
        return None
    return ConversionRules(model, [r for r in rules if isinstance(r, WeightRenaming)],
                           converters, getattr(model, "base_model_prefix", "") or "")


@dataclass
class ConvertedGroup:
    """The checkpoint tensors one converter turns into one or more parameters."""

    key: str  # the first target's name (transformers' layer name for the converter)
    converter: Any
    parts: dict[str, list[TensorRecord]]  # source pattern -> its tensors, in expert order
    outputs: dict[str, tuple[int, ...]] = field(default_factory=dict)  # parameter -> shape
    _job: Any = None

    @property
    def records(self) -> list[TensorRecord]:
        """The sources in the byte order of a stack: expert by expert, pattern by pattern."""
        lists = [self.parts[p] for p in self.converter.source_patterns if p in self.parts]
        return [r for row in zip(*lists, strict=True) for r in row]

    @property
    def dtype(self) -> DType:
        return next(iter(self.parts.values()))[0].dtype

    def describe(self) -> str:
        first = self.records[0]
        return f"made from {len(self.records)} tensors such as '{first.name}' ({first.file})"

    def streamable(self) -> bool:
        """The operations only stack along a new first dim (then concatenate along the next):
        the result is the parts' bytes in order."""
        ops = [(type(op).__name__, getattr(op, "dim", None)) for op in self.converter.operations]
        return ops in ([("MergeModulelist", 0)], [("MergeModulelist", 0), ("Concatenate", 1)])

    def handle(self, name: str, reader, dtype: DType, rules: ConversionRules):
        """The lazy handle of output `name`, to be read as `dtype`."""
        from .lazy_converted import ConvertJob, LazyConverted, LazyStack

        if self.streamable() and len(self.outputs) == 1:
            return LazyStack([reader.handle(r, dtype) for r in self.records], self.outputs[name])
        if self._job is None:
            sources = [reader.handle(r) for r in self.records]
            self._job = ConvertJob(sources, self._runner(rules))
        return LazyConverted(self._job, name, self.outputs[name], dtype)

    def run(self, tensors: list[Any], rules: ConversionRules) -> dict[str, Any]:
        """transformers' operations on `tensors` (in `records` order): parameter -> tensor."""
        conv = copy.deepcopy(self.converter)
        by_name = {r.name: t for r, t in zip(self.records, tensors, strict=True)}
        for pattern, records in self.parts.items():
            for record in records:
                conv.add_tensor(self.key, record.name, pattern,
                                lambda t=by_name[record.name]: t)
        out = conv.convert(self.key, model=rules.model,
                           config=getattr(rules.model, "config", None))
        return {k: v[0] if isinstance(v, list) else v for k, v in out.items()}

    def _runner(self, rules: ConversionRules) -> Callable[[list[Any]], dict[str, Any]]:
        return lambda tensors: self.run(tensors, rules)


@dataclass
class ConversionPlan:
    groups: dict[str, ConvertedGroup]  # parameter -> its group
    consumed: set[str]  # checkpoint names the groups take
    problems: list[Problem]


def plan(layout: CheckpointLayout, rules: ConversionRules | None,
         expected: Mapping[str, Any]) -> ConversionPlan:
    """Group the checkpoint tensors transformers converts into parameters, and check them."""
    result = ConversionPlan({}, set(), [])
    if rules is None:
        return result
    found: dict[str, ConvertedGroup] = {}
    indexed: dict[str, dict[str, dict[int, TensorRecord]]] = {}
    for name in sorted(layout.tensors):
        hit = rules.target(name, expected)
        if hit is None:
            continue
        key, converter, pattern = hit
        record = layout.tensors[name]
        result.consumed.add(name)
        found.setdefault(key, ConvertedGroup(key, converter, {}))
        index = _expert_index(rules.renamed(name), pattern)
        slots = indexed.setdefault(key, {}).setdefault(pattern, {})
        if index is None or index in slots:
            what = (f"has no expert number where '{pattern}' has its '*'" if index is None
                    else f"is expert {index} again (so is '{slots[index].name}')")
            result.problems.append((f"tensor '{name}' ({record.file}) of '{key}' {what}", record))
            continue
        slots[index] = record
    for key, group in found.items():
        if not any(indexed[key].values()):  # each of its tensors is a problem reported above
            continue
        problems = _check_group(group, indexed[key])
        if not problems:
            problems = _shape_outputs(group, rules, expected)
        result.problems.extend(problems)
        if not problems:
            for name in group.outputs:
                result.groups[name] = group
    return result


def _expert_index(name: str, pattern: str) -> int | None:
    if "*" not in pattern:
        return 0
    match = re.search(pattern.replace("*.", r"(\d+)\."), name)
    return int(match.group(1)) if match else None


def _check_group(group: ConvertedGroup, slots: dict[str, dict[int, TensorRecord]]
                 ) -> list[Problem]:
    """Each source pattern holds experts 0..E-1 (the same E), of one shape and one dtype."""
    problems: list[Problem] = []
    patterns = group.converter.source_patterns
    count = 1 + max(i for s in slots.values() for i in s)
    for pattern in patterns:
        got = slots.get(pattern, {})
        missing = [i for i in range(count) if i not in got]
        sample = next(iter(got.values()), None) or next(iter(next(iter(slots.values())).values()))
        if missing:
            shown = ", ".join(map(str, missing[:8])) + (" ..." if len(missing) > 8 else "")
            problems.append((f"'{group.key}' is stacked from {count} '{pattern}' tensors "
                             f"(one per expert, like '{sample.name}' in {sample.file}): "
                             f"expert(s) {shown} missing", sample))
        group.parts[pattern] = [got[i] for i in sorted(got)]
    if problems:
        return problems
    reference = group.records[0]
    for pattern in patterns:
        first = group.parts[pattern][0]
        for record in group.parts[pattern]:
            if record.shape != first.shape or record.dtype != reference.dtype:
                problems.append((f"tensor '{record.name}' ({record.file}) is {record.dtype}"
                                 f"{list(record.shape)}, but '{first.name}' of the same stack "
                                 f"is {reference.dtype}{list(first.shape)}", record))
    return problems


def _shape_outputs(group: ConvertedGroup, rules: ConversionRules,
                   expected: Mapping[str, Any]) -> list[Problem]:
    """Run transformers' operations on meta tensors: the outputs' names and shapes."""
    import torch

    meta = [torch.empty(r.shape, dtype=r.dtype.to_torch(), device="meta") for r in group.records]
    try:
        out = group.run(meta, rules)
    except Exception as exc:
        first = group.records[0]
        return [(f"transformers' conversion of {group.describe()} into '{group.key}' fails: "
                 f"{type(exc).__name__}: {exc}", first)]
    unknown = [k for k in out if k not in expected]
    if unknown:
        return [(f"transformers' conversion of {group.describe()} makes '{unknown[0]}', which "
                 "the model does not have", group.records[0])]
    group.outputs = {k: tuple(v.shape) for k, v in out.items()}
    return []
