from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from typing import ClassVar, Literal

import pytest

from compiler.errors import DayzeroError
from passes import (
    DEFAULT_PIPELINE,
    Pass,
    PassResult,
    available_passes,
    format_pipeline,
    get_pass,
    parse_pipeline,
    register_pass,
    unregister_pass,
)
from passes.fold_constants import FoldConstants

BUILTINS = {"eliminate_common_subexpressions", "eliminate_dead_code", "fold_constants",
            "remove_noops"}


def test_builtins_are_registered_with_summaries():
    assert BUILTINS <= set(available_passes())
    assert available_passes() == sorted(available_passes())
    for name in BUILTINS:
        cls = get_pass(name)
        assert cls.name == name and cls.summary and "\n" not in cls.summary
        assert "Needs" in cls.__doc__ and "Guarantees" in cls.__doc__ and "Why" in cls.__doc__


def test_default_pipeline_parses_in_order():
    passes = parse_pipeline(DEFAULT_PIPELINE)
    assert [p.name for p in passes] == ["remove_noops", "fold_constants",
                                        "eliminate_common_subexpressions",
                                        "recognize_causal_masks", "eliminate_dead_code",
                                        "plan_memory"]


@pytest.mark.parametrize("text", [
    "",
    "fold_constants",
    DEFAULT_PIPELINE,
    "fold_constants{max_growth=2.0},eliminate_dead_code",
    "fold_constants{max_growth=1.0}",
    "fold_constants{max_growth=2.5,always_fold_bytes=0},remove_noops,fold_constants",
])
def test_round_trip(text):
    assert format_pipeline(parse_pipeline(text)) == text


def test_options_are_typed_and_canonicalized():
    (p,) = parse_pipeline(" fold_constants { always_fold_bytes = 16 , max_growth=3 } ")
    assert p == FoldConstants(max_growth=3.0, always_fold_bytes=16)
    assert isinstance(p.max_growth, float) and isinstance(p.always_fold_bytes, int)
    assert format_pipeline([p]) == "fold_constants{max_growth=3.0,always_fold_bytes=16}"


def test_full_format_pins_every_option():
    passes = parse_pipeline("fold_constants,eliminate_dead_code")
    full = format_pipeline(passes, full=True)
    assert full == "fold_constants{max_growth=1.0,always_fold_bytes=1024},eliminate_dead_code"
    assert parse_pipeline(full) == passes
    assert format_pipeline([FoldConstants(max_growth=4.0)]) == "fold_constants{max_growth=4.0}"


def test_list_form_from_config_files():
    passes = parse_pipeline(["fold_constants{max_growth=2.0}", "eliminate_dead_code",
                             FoldConstants()])
    assert format_pipeline(passes) == \
        "fold_constants{max_growth=2.0},eliminate_dead_code,fold_constants"


def test_unknown_pass_names_it_and_lists_the_available_ones():
    with pytest.raises(DayzeroError) as info:
        parse_pipeline("fold_constants,fold_constnats")
    message = str(info.value)
    assert "unknown pass 'fold_constnats'" in message
    assert all(name in message for name in BUILTINS)
    assert "column 16" in message


def test_unknown_option_names_pass_option_and_lists_options():
    with pytest.raises(DayzeroError) as info:
        parse_pipeline("fold_constants{max_size=3}")
    message = str(info.value)
    assert "pass 'fold_constants' has no option 'max_size'" in message
    assert "max_growth (float, default 1.0)" in message
    assert "always_fold_bytes (int, default 1024)" in message


@pytest.mark.parametrize("text,expected", [
    ("fold_constants{always_fold_bytes=1.5}", "takes an integer, got '1.5'"),
    ("fold_constants{max_growth=big}", "takes a number, got 'big'"),
    ("fold_constants{max_growth}", "is not NAME=VALUE"),
    ("fold_constants{max_growth=2.0,max_growth=3.0}", "given twice"),
    ("eliminate_dead_code{x=1}", "pass 'eliminate_dead_code' has no option 'x'"),
    ("fold_constants,,eliminate_dead_code", "column 16"),
    ("fold_constants,", "column 16"),
    ("fold_constants{max_growth=2.0", "column 15"),
    ("fold_constants eliminate_dead_code", "column 16"),
    ("fold_constants{max_growth=2.0}}", "column 31"),
    ("9fold", "column 1"),
])
def test_malformed_pipelines_are_user_errors(text, expected):
    with pytest.raises(DayzeroError) as info:
        parse_pipeline(text)
    assert expected in str(info.value)


@dataclass(frozen=True)
class _OptionZoo(Pass):
    """Test pass with one option of every supported type; changes nothing."""

    name: ClassVar[str] = "test_option_zoo"
    summary: ClassVar[str] = "exercise option parsing"

    flag: bool = False
    count: int = 3
    label: str = "plain"
    mode: Literal["fast", "exact"] = "fast"

    def run(self, graph):
        return PassResult(graph, False)


@pytest.fixture
def zoo():
    register_pass(_OptionZoo)
    yield _OptionZoo
    unregister_pass(_OptionZoo.name)


def test_every_option_type_parses_and_prints_back(zoo):
    text = "test_option_zoo{flag=true,count=-2,label=attn.q_proj,mode=exact}"
    (p,) = parse_pipeline(text)
    assert p == _OptionZoo(flag=True, count=-2, label="attn.q_proj", mode="exact")
    assert format_pipeline([p]) == text
    with pytest.raises(DayzeroError, match="one of fast, exact"):
        parse_pipeline("test_option_zoo{mode=slow}")
    with pytest.raises(DayzeroError, match="true or false"):
        parse_pipeline("test_option_zoo{flag=yes}")


def test_registration_checks_the_contract(zoo):
    with pytest.raises(ValueError, match="already registered"):
        @register_pass
        @dataclass(frozen=True)
        class Clash(_OptionZoo):
            """Same name as the zoo."""

    class NotADataclass(Pass):
        """Missing @dataclass."""

        name: ClassVar[str] = "test_not_dataclass"
        summary: ClassVar[str] = "x"

        def run(self, graph):
            return PassResult(graph, False)

    with pytest.raises(TypeError, match="dataclass"):
        register_pass(NotADataclass)

    @dataclass(frozen=True)
    class BadOption(NotADataclass):
        """Option of an unsupported type."""

        name: ClassVar[str] = "test_bad_option"
        sizes: list = None

    with pytest.raises(TypeError, match="option sizes"):
        register_pass(BadOption)
    assert "test_bad_option" not in available_passes()

    @dataclass(frozen=True)
    class NoDoc(Pass):
        name: ClassVar[str] = "test_no_doc"
        summary: ClassVar[str] = "x"

        def run(self, graph):
            return PassResult(graph, False)

    with pytest.raises(TypeError, match="docstring"):
        register_pass(NoDoc)


def test_describe_passes_lists_summaries_and_options():
    from passes import describe_passes

    text = describe_passes()
    assert "fold_constants: precompute nodes whose operands are all constants" in text
    assert "[options: max_growth (float, default 1.0)" in text
    assert len(text.splitlines()) == len(available_passes())


def test_unregistered_pass_is_unknown():
    with pytest.raises(DayzeroError, match="unknown pass 'test_option_zoo'"):
        get_pass("test_option_zoo")


def test_importing_passes_does_not_import_torch():
    code = "import sys, passes; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
