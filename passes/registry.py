"""The pass registry: passes are enabled by name, and found only by explicit registration.

A pass module decorates its class with `@register_pass`; `passes/__init__.py` imports the built-in
pass modules by name. Nothing scans files or subclasses, so what a pipeline can call is exactly
what was registered (the same rule backends follow).
"""

from __future__ import annotations

from compiler.errors import DayzeroError

from .base import Pass, check_pass_class

_PASSES: dict[str, type[Pass]] = {}


def register_pass(cls: type[Pass]) -> type[Pass]:
    """Class decorator: make `cls` callable from pipelines as `cls.name`."""
    check_pass_class(cls)
    existing = _PASSES.get(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(f"pass name '{cls.name}' is already registered by "
                         f"{existing.__module__}.{existing.__qualname__}")
    _PASSES[cls.name] = cls
    return cls


def unregister_pass(name: str) -> None:
    """Remove a pass (tests and plugins that register temporary passes clean up with this)."""
    _PASSES.pop(name, None)


def available_passes() -> list[str]:
    """Names of every registered pass, sorted."""
    return sorted(_PASSES)


def get_pass(name: str) -> type[Pass]:
    """The pass class registered under `name`; an unknown name lists what exists."""
    try:
        return _PASSES[name]
    except KeyError:
        raise DayzeroError(f"unknown pass '{name}'", None,
                           "available passes: " + ", ".join(available_passes())) from None


def describe_passes() -> str:
    """One line per pass: name, summary and options (for listings and error messages)."""
    lines = []
    for name in available_passes():
        cls = _PASSES[name]
        opts = ", ".join(s.describe() for s in cls.option_specs())
        lines.append(f"{name}: {cls.summary}" + (f" [options: {opts}]" if opts else ""))
    return "\n".join(lines)
