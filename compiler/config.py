"""The compile configuration (shared/DESIGN.md, "Config file"), validated against a schema table.

A config is a dict or a YAML file. Every key is checked against `SCHEMA`; an unknown key or an
impossible value is a DayzeroError that names the key, so a typo never silently falls back to a
default. Options travel from here to the passes explicitly; nothing reads global state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import DayzeroError

_DTYPES = ("fp32", "fp16", "bf16", "fp8")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _one_of(*choices: Any) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        return value in choices
    check.__doc__ = f"one of {', '.join(map(str, choices))}"
    return check


def _pass_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and v for v in value)


_positive_int.__doc__ = "a positive integer"
_pass_list.__doc__ = "a list of pass names (strings)"

# section -> key -> (check, default)
SCHEMA: dict[str, dict[str, tuple[Callable[[Any], bool], Any]]] = {
    "parallel": {
        "tensor_parallel": (_positive_int, 1),
        "pipeline_parallel": (_positive_int, 1),
        "data_parallel": (_positive_int, 1),
    },
    "precision": {
        "weight_dtype": (_one_of(*_DTYPES), "fp32"),
        "activation_dtype": (_one_of(*_DTYPES), "fp32"),
        "kv_cache_dtype": (_one_of(*_DTYPES), "fp32"),
    },
    "quantize": {
        "weights": (_one_of(None, "int8", "int4"), None),
        "group_size": (_positive_int, 128),
    },
}
_TOP_LEVEL = set(SCHEMA) | {"passes"}


@dataclass(frozen=True)
class CompileConfig:
    parallel: dict[str, Any] = field(default_factory=dict)
    precision: dict[str, Any] = field(default_factory=dict)
    quantize: dict[str, Any] = field(default_factory=dict)
    passes: list[str] | None = None
    source: str = "<config>"

    def section(self, name: str) -> dict[str, Any]:
        return getattr(self, name)


def load_config(config: Mapping[str, Any] | str | Path | None) -> CompileConfig:
    """Validate a config dict or YAML file; defaults fill what it leaves out."""
    if config is None:
        return _complete({}, "<defaults>")
    if isinstance(config, (str, Path)):
        path = Path(config)
        if not path.is_file():
            raise DayzeroError(f"config file {path} does not exist", str(path),
                               "pass the path of a YAML file (see docs/architecture.md)")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}: line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
            raise DayzeroError(f"config file is not valid YAML: {getattr(exc, 'problem', exc)}",
                               where, "fix the YAML syntax") from None
        return _complete(data, str(path))
    return _complete(dict(config), "<config>")


def _complete(data: Any, source: str) -> CompileConfig:
    if not isinstance(data, Mapping):
        raise DayzeroError("config must be a mapping of sections", source,
                           f"use top-level keys {sorted(_TOP_LEVEL)}")
    for key in data:
        if key not in _TOP_LEVEL:
            raise DayzeroError(f"unknown config key '{key}'", source,
                               f"valid top-level keys are {sorted(_TOP_LEVEL)}")
    sections = {}
    for name, keys in SCHEMA.items():
        given = data.get(name) or {}
        if not isinstance(given, Mapping):
            raise DayzeroError(f"config key '{name}' must be a mapping", source)
        values = {}
        for key, value in given.items():
            if key not in keys:
                raise DayzeroError(f"unknown config key '{name}.{key}'", source,
                                   f"valid keys in '{name}' are {sorted(keys)}")
            check = keys[key][0]
            if not check(value):
                raise DayzeroError(f"config key '{name}.{key}' has impossible value {value!r}",
                                   source, f"use {check.__doc__}")
            values[key] = value
        sections[name] = {k: values.get(k, default) for k, (_, default) in keys.items()}
    passes = data.get("passes")
    if passes is not None and not _pass_list(passes):
        raise DayzeroError(f"config key 'passes' has impossible value {passes!r}", source,
                           f"use {_pass_list.__doc__}")
    return CompileConfig(sections["parallel"], sections["precision"], sections["quantize"],
                         passes, source)
