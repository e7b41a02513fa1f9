"""Checkpoint names, shapes and dtypes against what the model expects, before any byte is read.

A mismatch found after converting gigabytes is a wasted hour; a mismatch found one at a time is
a wasted afternoon. So the check runs on headers only and reports every problem at once:
checkpoint tensors the model does not expect, parameters the checkpoint lacks, shape and dtype
mismatches, each with its name and shard file.

Handled as Hugging Face's loader handles them: tied parameters (an LM head sharing the embedding
is saved once, under either name), base-model checkpoints loaded into a model with a head (names
without `base_model_prefix.`), tensors the model class says to ignore
(`_keys_to_ignore_on_load_unexpected`) and stale copies of buffers the model computes itself
(non-persistent buffers such as `rotary_emb.inv_freq`), and the legacy names transformers
renames on load (`renames`: a LLaVA checkpoint stores `language_model.model.*` for the model's
`model.language_model.*`). Persistent buffers missing from the
checkpoint keep the value the model computed when it was built.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from compiler.ir import DType

from . import precision
from .conversion import ConversionRules, ConvertedGroup, plan
from .layout import CheckpointError, CheckpointLayout, TensorRecord

MAX_LISTED = 40


@dataclass(frozen=True)
class Expected:
    """A tensor the model's state dict holds: parameter or persistent buffer."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    parameter: bool


@dataclass
class ModelTensors:
    """What a model expects from its checkpoint (taken from the model built on the meta device)."""

    expected: dict[str, Expected]
    tied: list[list[str]]  # groups of names sharing one tensor, in state-dict order
    computed: set[str] = field(default_factory=set)  # non-persistent buffers
    prefix: str = ""  # base_model_prefix
    ignore_unexpected: Sequence[str] = ()  # regexes
    # legacy checkpoint name -> model name, as transformers renames on load (None: keep)
    renames: Callable[[str], str] | None = None
    # transformers' converters (per-expert tensors -> stacked experts), None where it has none
    conversions: ConversionRules | None = None


@dataclass
class Binding:
    """The outcome of a successful check: each expected name -> its checkpoint record."""

    records: dict[str, TensorRecord]
    notes: list[str]
    # parameters transformers assembles from several checkpoint tensors (stacked experts)
    converted: dict[str, ConvertedGroup] = field(default_factory=dict)
    rules: ConversionRules | None = None

    def record_for(self, name: str) -> TensorRecord | None:
        return self.records.get(name)


def match(layout: CheckpointLayout, model: ModelTensors, model_name: str) -> Binding:
    """Bind checkpoint tensors to model names; one CheckpointError lists every mismatch."""
    conversion = plan(layout, model.conversions, model.expected)
    names = {c: m for c, m in _rename(layout, model).items() if c not in conversion.consumed}
    by_model = {model_name_: ckpt for ckpt, model_name_ in names.items()}
    problems: list[str] = [text for text, _ in conversion.problems]
    notes: list[str] = []
    records: dict[str, TensorRecord] = {}
    for name, group in conversion.groups.items():
        problem = _compare_converted(group, name, model.expected[name])
        if problem:
            problems.append(problem)
    grouped = {n for group in model.tied for n in group}
    groups = list(model.tied) + [[n] for n in model.expected if n not in grouped]
    for group in groups:
        present = [n for n in group if n in by_model]
        if any(n in conversion.groups for n in group):
            continue
        if not present:
            exp = model.expected[group[0]]
            if exp.parameter:
                tied = f" (tied to {', '.join(repr(n) for n in group[1:])})" if group[1:] else ""
                problems.append(f"missing parameter '{group[0]}'{tied}: "
                                f"{exp.dtype}{list(exp.shape)}, in no shard")
            else:
                notes.append(f"buffer '{group[0]}' is not in the checkpoint: the value the model "
                             "computes is used")
            continue
        for name in present:
            problem = _compare(layout.tensors[by_model[name]], model.expected[name], name)
            if problem:
                problems.append(problem)
        chosen = layout.tensors[by_model[present[0]]]
        for name in group:
            records[name] = chosen
        if len(present) > 1:
            notes.append(f"tied copies {', '.join(repr(n) for n in present[1:])} ignored: "
                         f"'{present[0]}' is used for all of them")
    for ckpt, mapped in names.items():
        if mapped in model.expected:
            continue
        record = layout.tensors[ckpt]
        if mapped in model.computed or _ignored(ckpt, model.ignore_unexpected):
            notes.append(f"tensor '{ckpt}' ({record.file}) ignored: the model computes it or "
                         "does not use it")
            continue
        problems.append(f"unexpected tensor '{ckpt}' ({record.file}): "
                        f"{record.dtype}{list(record.shape)}, the model has no such parameter")
    if problems:
        raise (_per_expert_error(layout, model, model_name, conversion.consumed)
               or _mismatch_error(layout, model_name, problems, conversion.problems))
    if conversion.groups:
        notes.append(f"{len(conversion.groups)} parameter(s) assembled from "
                     f"{len(conversion.consumed)} checkpoint tensors by transformers' conversion "
                     "mapping (experts stacked)")
    return Binding(records, notes, conversion.groups, model.conversions)


_PER_EXPERT = re.compile(r"\.experts\.\d+\.")
_STACKED = re.compile(r"\.experts\.[A-Za-z_]+$")


def _per_expert_error(layout: CheckpointLayout, model: ModelTensors, model_name: str,
                      converted: set[str]) -> CheckpointError | None:
    """Per-expert tensors (the Hub's MoE layout) for a model that stacks its experts, none of
    which a converter of transformers' mapping reads: the config is the right one, the expert
    names are not ones transformers knows for this model. Not the generic 'wrong config.json'
    error. (Where some are read, the others are misnamed, and listed as such.)"""
    per_expert = sorted(n for n in layout.tensors if _PER_EXPERT.search(n))
    stacked = sorted(n for n in model.expected if _STACKED.search(n))
    if not per_expert or not stacked or converted:  # mapped: what is left is named one by one
        return None
    rules = model.conversions
    reads = sorted({p for c in rules.converters for p in c.source_patterns if "*" in p}
                   ) if rules else []
    known = (f"transformers' conversion mapping for this model stacks tensors named "
             f"{', '.join(repr(p) for p in reads[:6])}" if reads else
             "transformers has no conversion mapping that stacks per-expert tensors for "
             f"{model_name}")
    where = layout.tensors[per_expert[0]]
    return CheckpointError(
        f"checkpoint {layout.root} stores its experts one tensor per expert ({len(per_expert)} "
        f"tensors such as '{per_expert[0]}'), while {model_name} keeps them stacked (parameters "
        f"such as '{stacked[0]}'), and {known}: these expert names are not among them",
        str(layout.root / where.file),
        "rename the expert tensors to the names above (or store them stacked, one "
        f"[experts, ...] tensor per parameter such as '{stacked[0]}'), or use a transformers "
        "release whose conversion mapping reads this layout")


def _rename(layout: CheckpointLayout, model: ModelTensors) -> dict[str, str]:
    """Checkpoint name -> model name; adds `base_model_prefix.` for a base-model checkpoint."""
    prefix = f"{model.prefix}." if model.prefix else ""
    names = {n: n for n in layout.tensors}
    if model.renames is not None and any(n not in model.expected for n in names):
        renamed = {n: model.renames(n) for n in layout.tensors}
        if sum(r in model.expected for r in renamed.values()) > \
                sum(n in model.expected for n in names):
            return renamed
    if not prefix or any(n.startswith(prefix) for n in layout.tensors):
        return names
    if not any(n.startswith(prefix) for n in model.expected):
        return names
    return {n: (prefix + n if prefix + n in model.expected else n) for n in layout.tensors}


def _compare(record: TensorRecord, expected: Expected, name: str) -> str | None:
    shown = name if record.name == name else f"{name}' (stored as '{record.name}"
    if tuple(record.shape) != tuple(expected.shape):
        return (f"shape mismatch '{shown}' ({record.file}): checkpoint {record.dtype}"
                f"{list(record.shape)}, model expects {expected.dtype}{list(expected.shape)}")
    if not precision.convertible(record.dtype, expected.dtype):
        return (f"dtype mismatch '{shown}' ({record.file}): checkpoint {record.dtype}, model "
                f"expects {expected.dtype} (only fp32/bf16/fp16 are converted into each other)")
    return None


def _compare_converted(group: ConvertedGroup, name: str, expected: Expected) -> str | None:
    shape = group.outputs[name]
    if shape != tuple(expected.shape):
        return (f"shape mismatch '{name}' ({group.describe()}): checkpoint {group.dtype}"
                f"{list(shape)}, model expects {expected.dtype}{list(expected.shape)}")
    if not precision.convertible(group.dtype, expected.dtype):
        return (f"dtype mismatch '{name}' ({group.describe()}): checkpoint {group.dtype}, "
                f"model expects {expected.dtype} (only fp32/bf16/fp16 are converted into "
                "each other)")
    return None


def _ignored(name: str, patterns: Iterable[str]) -> bool:
    return any(re.search(p, name) for p in patterns)


def _mismatch_error(layout: CheckpointLayout, model_name: str, problems: list[str],
                    converted: list[tuple[str, TensorRecord | None]]) -> CheckpointError:
    shown = problems[:MAX_LISTED]
    more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
    where, fix = _expert_place(layout, converted) if converted else (
        str(layout.root / (layout.index or layout.files[0])),
        "use the config.json that belongs to these weights (same architecture and sizes), or "
        "re-download the checkpoint if shards are from another revision")
    return CheckpointError(
        f"checkpoint {layout.root} does not match {model_name} built from its config.json: "
        f"{len(problems)} problem(s)\n  " + "\n  ".join(shown) + more, where, fix)


def _expert_place(layout: CheckpointLayout, converted: list[tuple[str, TensorRecord | None]]
                  ) -> tuple[str, str]:
    """Where and fix for expert tensors that cannot be stacked: the first one named."""
    record = next((r for _, r in converted if r is not None), None)
    where = (f"{layout.root / record.file}, tensor '{record.name}'" if record
             else str(layout.root / (layout.index or layout.files[0])))
    return where, ("the expert tensors named above are missing, misnamed or damaged (a stacked "
                   "parameter takes experts 0..E-1 of one shape and dtype): re-download the "
                   "shard(s) holding them, or fix their names")
