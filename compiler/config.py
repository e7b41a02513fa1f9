"""The compile configuration (shared/DESIGN.md, "Config file"), validated against a schema table.

A config is a dict or a YAML file. Every key is checked against `SCHEMA`; an unknown key or an
impossible value is a DayzeroError that names the key, so a typo never silently falls back to a
default. Options travel from here to the passes explicitly; nothing reads global state.

`backend_options` is keyed by backend name and holds each backend's own options (for
onnxruntime: `session`, `exclude_kernels`). Only the names are checked here: the options belong
to the backend, which validates them when it lowers (naming `backend_options.<backend>.<key>`).
The same mapping can come from `compiler.compile(backend_options=...)` and from
`dayzero compile --backend-option [BACKEND:]KEY=VALUE`; those are merged over the file's section
(`with_backend_options`), key by key, the later source winning.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
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


def _size(value: Any) -> bool:
    from runtime.generation.spec import parse_bytes

    try:
        parse_bytes(value, "size")
    except DayzeroError:
        return False
    return True


_positive_int.__doc__ = "a positive integer"
_size.__doc__ = "a size such as 2GiB, 512MiB or a number of bytes"
_pass_list.__doc__ = "a list of pass names (strings)"

# section -> key -> (check, default)
SCHEMA: dict[str, dict[str, tuple[Callable[[Any], bool], Any]]] = {
    "parallel": {
        "tensor_parallel": (_positive_int, 1),
        "pipeline_parallel": (_positive_int, 1),
        "data_parallel": (_positive_int, 1),
        # a mixture of experts' experts over the tensor-parallel ranks (or as many of its own)
        "expert_parallel": (_positive_int, 1),
    },
    "precision": {
        "weight_dtype": (_one_of(*_DTYPES), "fp32"),
        "activation_dtype": (_one_of(*_DTYPES), "fp32"),
        "kv_cache_dtype": (_one_of(*_DTYPES, "int8"), "fp32"),
    },
    "quantize": {
        "weights": (_one_of(None, "int8", "int4"), None),
        "group_size": (_positive_int, 128),
        # int8: the quantized linears' inputs are quantized per block too (int8 dot products)
        "activations": (_one_of("float", "int8"), "float"),
    },
    # generation artifacts (task text-generation): the runtime's paged KV cache and step sizes
    "generation": {
        "kv_cache_memory": (_size, "2GiB"),
        "block_size": (_positive_int, 16),
        "prefill_chunk": (_positive_int, 512),
        "max_batch_tokens": (_positive_int, 2048),
    },
}
_TOP_LEVEL = set(SCHEMA) | {"passes", "backend_options"}


@dataclass(frozen=True)
class CompileConfig:
    parallel: dict[str, Any] = field(default_factory=dict)
    precision: dict[str, Any] = field(default_factory=dict)
    quantize: dict[str, Any] = field(default_factory=dict)
    passes: list[str] | None = None
    source: str = "<config>"
    backend_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    generation: dict[str, Any] = field(default_factory=dict)

    def section(self, name: str) -> dict[str, Any]:
        return getattr(self, name)

    def with_backend_options(self, overrides: Mapping[str, Any] | None,
                             source: str = "backend_options argument") -> CompileConfig:
        """This config with `overrides` (same shape as the section) merged over its
        `backend_options`, key by key: the overrides win."""
        if not overrides:
            return self
        checked = _backend_options(overrides, source)
        return replace(self, backend_options=merge_options(self.backend_options, checked))

    def with_settings(self, settings: Mapping[str, Any], source: str) -> CompileConfig:
        """This config with `settings` ({"section.key": value}) replacing those keys, each
        checked as the file's keys are; `source` (e.g. the command-line flag) names where a
        value came from when it is impossible."""
        sections = {name: dict(self.section(name)) for name in SCHEMA}
        for dotted, value in settings.items():
            section, _, key = dotted.partition(".")
            if section not in SCHEMA:
                raise DayzeroError(f"unknown config key '{dotted}'", source,
                                   f"valid sections are {sorted(SCHEMA)}")
            sections[section][key] = _checked(section, key, value, source)
        if not settings:
            return self
        where = source if self.source == "<defaults>" else f"{self.source} with {source}"
        return replace(self, **sections, source=where)

    def options_for(self, backend: str) -> dict[str, Any]:
        """The options for backend `backend` (a copy: the caller may add to it)."""
        return copy.deepcopy(self.backend_options.get(backend, {}))


def load_config(config: CompileConfig | Mapping[str, Any] | str | Path | None) -> CompileConfig:
    """Validate a config dict or YAML file; defaults fill what it leaves out. A CompileConfig
    (already checked, e.g. a file with command-line settings over it) is returned as it is."""
    if isinstance(config, CompileConfig):
        return config
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
        values = {key: _checked(name, key, value, source) for key, value in given.items()}
        sections[name] = {k: values.get(k, default) for k, (_, default) in keys.items()}
    passes = data.get("passes")
    if passes is not None and not _pass_list(passes):
        raise DayzeroError(f"config key 'passes' has impossible value {passes!r}", source,
                           f"use {_pass_list.__doc__}")
    return CompileConfig(sections["parallel"], sections["precision"], sections["quantize"],
                         passes, source, _backend_options(data.get("backend_options"), source),
                         sections["generation"])


def _checked(section: str, key: str, value: Any, source: str) -> Any:
    """`value` for config key `section.key`, or a DayzeroError naming the key and `source`."""
    keys = SCHEMA[section]
    if key not in keys:
        raise DayzeroError(f"unknown config key '{section}.{key}'", source,
                           f"valid keys in '{section}' are {sorted(keys)}")
    check = keys[key][0]
    if not check(value):
        raise DayzeroError(f"config key '{section}.{key}' has impossible value {value!r}",
                           source, f"use {check.__doc__}")
    return value


def parse_setting(key: str, text: str) -> Any:
    """The value of config key `key` ("section.key") written on the command line: YAML, as in
    the config file (`16`, `512MiB`, `bf16`). Raises ValueError with one message when it is not
    a value the key takes (a command-line usage error)."""
    section, _, name = key.partition(".")
    check = SCHEMA[section][name][0]
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = None
    if value is None or not check(value):
        raise ValueError(f"'{text}' is not {check.__doc__}")
    return value


def _backend_options(data: Any, source: str) -> dict[str, dict[str, Any]]:
    """The `backend_options` section: registered backend names -> mappings of options."""
    if data is None:
        return {}
    example = "e.g. backend_options: {onnxruntime: {session: {intra_op_threads: 2}}}"
    if not isinstance(data, Mapping):
        raise DayzeroError("config key 'backend_options' must be a mapping of backend names "
                           f"to options, not {data!r}", source, example)
    import backends

    names = backends.available()
    checked = {}
    for name, options in data.items():
        if name not in names:
            raise DayzeroError(f"config key 'backend_options.{name}' names no registered "
                               "backend", source, f"use one of the backends {names}")
        if options is not None and not isinstance(options, Mapping):
            raise DayzeroError(f"config key 'backend_options.{name}' must be a mapping of "
                               f"options, not {options!r}", source, example)
        checked[name] = copy.deepcopy(dict(options or {}))
    return checked


def merge_options(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` merged over `base`: mappings merge key by key, anything else is replaced."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_options(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


@dataclass(frozen=True)
class OptionAssignment:
    """One `[BACKEND:]KEY=VALUE` from the command line: KEY a dotted path, VALUE parsed YAML."""

    backend: str | None
    path: tuple[str, ...]
    value: Any


_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BACKEND = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def parse_assignment(text: str, prefixed: bool = True) -> OptionAssignment:
    """Parse `[BACKEND:]a.b.c=VALUE` (the prefix only when `prefixed`); VALUE is YAML, so
    `true`, `2`, `auto` and `[com.microsoft.Gelu]` mean what they do in the config file.
    Raises ValueError with one message for bad syntax (a command-line usage error)."""
    key, eq, raw = text.partition("=")
    shape = "[BACKEND:]KEY=VALUE" if prefixed else "KEY=VALUE"
    if not eq:
        raise ValueError(f"'{text}' is not {shape} (no '=')")
    backend = None
    if prefixed and ":" in key:
        backend, _, key = key.partition(":")
        if not _BACKEND.fullmatch(backend):
            raise ValueError(f"'{text}': '{backend}' before ':' is not a backend name")
    if not all(_KEY.fullmatch(part) for part in key.split(".")):
        raise ValueError(f"'{text}': '{key}' is not a key or a dotted path of keys "
                         "(e.g. session.intra_op_threads)")
    if not raw.strip():
        raise ValueError(f"'{text}' has no value after '='")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ValueError(f"'{text}': the value is not valid YAML "
                         f"({getattr(exc, 'problem', None) or exc})") from None
    return OptionAssignment(backend, tuple(key.split(".")), value)


def options_from_assignments(assignments: Iterable[OptionAssignment],
                             default_backend: str) -> dict[str, dict[str, Any]]:
    """The `backend_options` mapping the assignments spell (unprefixed ones belong to
    `default_backend`); a later assignment wins over an earlier one on the same key."""
    options: dict[str, dict[str, Any]] = {}
    for item in assignments:
        target = options.setdefault(item.backend or default_backend, {})
        for part in item.path[:-1]:
            if not isinstance(target.get(part), dict):
                target[part] = {}
            target = target[part]
        target[item.path[-1]] = item.value
    return options
