"""The pass contract: a named, registered Graph -> Graph transform with typed options.

A pass is a frozen dataclass subclassing `Pass`: class attributes `name` (what pipelines call it)
and `summary` (one line for listings), dataclass fields for its options (int, float, bool, str or
a `Literal[...]` of strings, each with a default), and `run(graph) -> PassResult`. Options are
plain fields so that they travel explicitly from the pipeline string or config file to the pass
and print back into the pipeline string (MLIR's `Pass<"cse">` with `Option<>` members); a pass
never reads global flags or the environment.

`PassResult.changed` must be computed from what the pass did, never hard-coded: the pass manager
trusts it for dumps and cross-checks it against the printed IR when verifying.
"""

from __future__ import annotations

import abc
import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, NamedTuple

from compiler.errors import DayzeroError
from compiler.ir import Graph


class PassResult(NamedTuple):
    """What a pass returns: the (possibly new) graph and whether anything changed."""

    graph: Graph
    changed: bool


@dataclass(frozen=True)
class OptionSpec:
    """One option of a pass: its name, value type, allowed choices (for Literal) and default."""

    name: str
    type: type
    default: Any
    choices: tuple[str, ...] = ()

    def describe(self) -> str:
        kind = "|".join(self.choices) if self.choices else self.type.__name__
        return f"{self.name} ({kind}, default {format_value(self.default)})"


SUPPORTED_TYPES = (bool, int, float, str)


class Pass(abc.ABC):
    """Base of every pass; subclasses are `@dataclass(frozen=True)` and registered by name."""

    name: ClassVar[str]
    summary: ClassVar[str]
    # named analyses (compiler.ir.analysis) this pass leaves valid even when it changes the
    # graph; the pass manager drops every other cached result after a changed pass
    preserves: ClassVar[tuple[str, ...]] = ()

    @abc.abstractmethod
    def run(self, graph: Graph) -> PassResult:
        """Transform `graph` (in place or into a new graph) and say whether anything changed."""

    # -- options ------------------------------------------------------------------------------
    @classmethod
    def option_specs(cls) -> list[OptionSpec]:
        """The pass's options in declaration order, with resolved types."""
        hints = typing.get_type_hints(cls)
        specs = []
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            choices: tuple[str, ...] = ()
            if typing.get_origin(hint) is Literal:
                choices = tuple(typing.get_args(hint))
                hint = str
            specs.append(OptionSpec(f.name, hint, f.default, choices))
        return specs

    def options(self) -> dict[str, Any]:
        return {spec.name: getattr(self, spec.name) for spec in self.option_specs()}

    def spec(self, full: bool = False) -> str:
        """This pass as a pipeline element, `name{opt=value,...}`.

        Prints the options that differ from their defaults or that were given explicitly in the
        pipeline text (so a parsed pipeline prints back unchanged); `full` prints all of them,
        which pins the meaning even if a default changes later.
        """
        given = getattr(self, "_given", frozenset())
        shown = [(s.name, getattr(self, s.name)) for s in self.option_specs()
                 if full or s.name in given or getattr(self, s.name) != s.default]
        if not shown:
            return self.name
        return self.name + "{" + ",".join(f"{k}={format_value(v)}" for k, v in shown) + "}"

    @classmethod
    def configure(cls, options: dict[str, str], where: str | None = None) -> Pass:
        """An instance from option texts (as written in a pipeline), checking names and values."""
        specs = {s.name: s for s in cls.option_specs()}
        values = {}
        for key, text in options.items():
            if key not in specs:
                known = ", ".join(s.describe() for s in specs.values()) or "none"
                raise DayzeroError(f"pass '{cls.name}' has no option '{key}'", where,
                                   f"its options are: {known}")
            values[key] = parse_value(cls.name, specs[key], text, where)
        instance = cls(**values)
        object.__setattr__(instance, "_given", frozenset(values))
        return instance


def format_value(value: Any) -> str:
    """The pipeline-text form of an option value (parse_value reads it back)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def parse_value(pass_name: str, spec: OptionSpec, text: str, where: str | None) -> Any:
    """Read one option value by the option's type; a bad value names the pass and option."""
    def bad(expected: str) -> DayzeroError:
        return DayzeroError(f"option '{spec.name}' of pass '{pass_name}' takes {expected}, "
                            f"got '{text}'", where, f"write e.g. {spec.name}="
                            f"{format_value(spec.default)}")

    text = text.strip()
    if spec.choices:
        if text not in spec.choices:
            raise bad("one of " + ", ".join(spec.choices))
        return text
    if spec.type is bool:
        if text not in ("true", "false"):
            raise bad("true or false")
        return text == "true"
    if spec.type is int:
        try:
            return int(text)
        except ValueError:
            raise bad("an integer") from None
    if spec.type is float:
        try:
            return float(text)
        except ValueError:
            raise bad("a number") from None
    if not text or any(c in text for c in ",{}="):
        raise bad("a word without ',', '{', '}' or '='")
    return text


def check_pass_class(cls: type) -> None:
    """Raise TypeError if `cls` does not follow the pass contract (checked at registration)."""
    problems = []
    if not (isinstance(cls, type) and issubclass(cls, Pass)):
        raise TypeError(f"{cls!r} is not a subclass of passes.base.Pass")
    if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:
        problems.append("decorate it with @dataclass(frozen=True)")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.isidentifier():
        problems.append("give it a class attribute `name` that is an identifier")
    summary = getattr(cls, "summary", None)
    if not isinstance(summary, str) or not summary or "\n" in summary:
        problems.append("give it a one-line class attribute `summary`")
    doc = (cls.__doc__ or "").strip()
    if not doc or doc.startswith(f"{cls.__name__}("):  # dataclass fills in a signature
        problems.append("give it a docstring (needs, guarantees, why it exists)")
    if not problems:
        for spec in cls.option_specs():
            if spec.type not in SUPPORTED_TYPES:
                problems.append(f"option {spec.name} has type {spec.type}; use bool, int, float, "
                                "str or Literal[...]")
            if spec.default is dataclasses.MISSING:
                problems.append(f"option {spec.name} needs a default")
    if problems:
        raise TypeError(f"pass class {cls.__name__}: " + "; ".join(problems))
