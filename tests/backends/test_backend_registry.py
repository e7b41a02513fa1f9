"""The backend registry: built-ins, entry-point plugins, explicit registration, clear failures."""

from __future__ import annotations

import pytest

import backends
from backends import Backend, Capabilities
from backends.reference import ReferenceBackend
from compiler.errors import DayzeroError


class TinyBackend(Backend):
    name = "tiny"

    def capabilities(self):
        return Capabilities(ops=frozenset({"add"}))

    def lower(self, graph, weights, options):
        return {}

    def load(self, artifact):
        return lambda inputs: list(inputs)


class BrokenBackend(TinyBackend):
    def __init__(self):
        raise OSError("no device found")


@pytest.fixture
def cleanup():
    names = []
    yield names
    for name in names:
        backends.unregister(name)


def test_builtins_and_entry_points_are_available(plugin_site):
    names = backends.available()
    assert names == sorted(names)
    assert {"reference", "onnxruntime", "triton", "testplugin"} <= set(names)


def test_the_test_setup_installs_no_backend():
    """README's test command must leave a user's `dayzero backends` as it found it."""
    assert "testplugin" not in backends.available(), \
        "a stale install of tests/plugin: pip uninstall dayzero-testplugin"


def test_get_returns_a_fresh_instance():
    a, b = backends.get("reference"), backends.get("reference")
    assert isinstance(a, ReferenceBackend) and a is not b and a.name == "reference"


def test_unknown_backend_lists_the_available_ones():
    with pytest.raises(DayzeroError) as info:
        backends.get("nonexistent")
    err = info.value
    assert err.what == ("unknown backend 'nonexistent'; available: "
                        + ", ".join(backends.available()))
    assert "dayzero.backends" in err.fix and "backends.register" in err.fix
    assert "docs/backends.md" in err.fix


def test_register_a_class(cleanup):
    cleanup.append("tiny")
    backends.register("tiny", TinyBackend)
    assert "tiny" in backends.available()
    assert backends.get("tiny").capabilities().ops == {"add"}
    backends.unregister("tiny")
    assert "tiny" not in backends.available()


def test_register_a_module_class_string_loads_lazily(cleanup):
    cleanup.extend(["lazy", "missing", "notabackend"])
    backends.register("lazy", f"{__name__}:TinyBackend")
    assert isinstance(backends.get("lazy"), TinyBackend)
    backends.register("missing", "no_such_module_anywhere:Backend")
    assert "missing" in backends.available()  # listing imports nothing
    with pytest.raises(DayzeroError, match="backend 'missing' is registered but cannot be "
                                           "imported: No module named 'no_such_module_anywhere'"):
        backends.get("missing")
    backends.register("notabackend", "collections:OrderedDict")
    with pytest.raises(DayzeroError, match="not a Backend subclass"):
        backends.get("notabackend")


def test_a_builtin_backend_missing_from_the_install_says_which_distribution_has_it(monkeypatch):
    """Under dayzero-runtime (packaging/runtime) backends.reference is not installed at all."""
    from backends import registry

    monkeypatch.setitem(registry.BUILTINS, "reference", "backends.not_installed:ReferenceBackend")
    with pytest.raises(DayzeroError, match="No module named 'backends.not_installed'") as info:
        backends.get("reference")
    assert info.value.fix == ("this installation has no 'reference' backend (dayzero-runtime "
                              "ships only onnxruntime); install dayzero to use it")
    backends.register("missing", "no_such_module_anywhere:Backend")
    try:
        with pytest.raises(DayzeroError) as info:
            backends.get("missing")
    finally:
        backends.unregister("missing")
    assert info.value.fix == "install the backend's dependencies, or reinstall its package"


def test_registration_overrides_and_is_checked(cleanup):
    cleanup.extend(["reference", "broken"])
    backends.register("reference", TinyBackend)
    assert isinstance(backends.get("reference"), TinyBackend)
    backends.unregister("reference")
    assert isinstance(backends.get("reference"), ReferenceBackend)
    with pytest.raises(TypeError, match="not a subclass of backends.Backend"):
        backends.register("x", dict)
    with pytest.raises(ValueError, match="'module:Class'"):
        backends.register("x", "just_a_module")
    backends.register("broken", BrokenBackend)
    with pytest.raises(DayzeroError, match="backend 'broken' failed to start: OSError: no device"):
        backends.get("broken")
