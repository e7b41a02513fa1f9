"""Issue 33, item 9: the triton backend regenerates kernel source from an artifact's graph.dzir
at load and executes it, so graph.dzir is hostile input to a code generator. Whoever edits it
also rewrites kernels.json's hash (computed here with the backend's own generator, as an
attacker would). Names, symbols and attribute values of the IR must never reach the source as
code: loading either runs and matches the reference interpreter on the same (edited) graph, or
refuses with a DayzeroError; a string planted to create a file never runs."""

from __future__ import annotations

import ast
import json
import math
import os
import re
import tempfile
import uuid
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (no CUDA here)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import sympy  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hypothesis import HealthCheck, event, given, note, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch import nn  # noqa: E402

import backends.triton as triton_backend  # noqa: E402
import compiler  # noqa: E402
import runtime  # noqa: E402
from backends.reference.interpreter import run_graph  # noqa: E402
from backends.triton import TritonBackend, module_source, plan, sha256  # noqa: E402
from backends.triton.source_guard import ATTRIBUTES, check_source  # noqa: E402
from compiler.errors import ArtifactError, DayzeroError  # noqa: E402
from compiler.ir import OPS, DType, parse_ir, print_ir, symbol  # noqa: E402
from compiler.ir.ops.registry import META_ATTRS  # noqa: E402

pytest.importorskip("triton")

# A file each planted string would create if any of it ran as code ("pwn" is in its name).
MARKER = Path(tempfile.gettempdir()) / f"dayzero-pwn-{os.getpid()}-{uuid.uuid4().hex}"
CODE = [
    f"__import__('os').system('touch {MARKER}')",
    f"\"); __import__('os').system(\"touch {MARKER}\"); (\"",
    f"'); open('{MARKER}', 'w'); ('",
    f"0\n__import__('pathlib').Path('{MARKER}').touch()\n",
    f"x0) + __import__('pathlib').Path('{MARKER}').touch() + (x0",
    f"{{0}} {{beta!r}} {{0.__class__}} pwn {MARKER}",
    "pwn \\\" \\\\ \u2028 \x00 \ud800",
]
# Value and weight names: planted code, the generator's own identifiers, odd text.
NAMES = st.one_of(st.sampled_from([*CODE, "x0", "in0", "out1", "v2", "tl", "triton", "k0_mul",
                                   "__builtins__", "a.b", "1", "%", "@w", "", " "]),
                  st.text(max_size=12))
# Size symbol names (grammar NAMEs): the generator's identifiers, builtins, Python names.
SYMBOLS = ["x0", "in0", "out0", "v0", "n0", "s0_0", "tl", "triton", "open", "__import__",
           "exec", "N", "R", "BLOCK", "mask", "offs", "float", "k0_mul", "pwn_symbol"]
FLOATS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-320, 5e-324, 1e308, -1e308, 3.0, -2.5]
INTS = [0, 1, -1, 7, 2**40]
OTHERS = [True, False, None, DType.f32, DType.i64, "none", "tanh", "gelu", "out_in", "in_out",
          "trunc", "nan", "inf", "1.5"]


class Hostile(nn.Module):
    """Every op whose attributes the generator reads in a kernel, in a few kernels."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8))
        self.norm = nn.LayerNorm(8)
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        y = F.softplus(x * self.w, beta=2.0, threshold=10.0)
        y = F.leaky_relu(y - 1.0, 0.1) + y.clamp(-0.5, 0.5)
        z = F.gelu(self.proj(self.norm(y)), approximate="tanh")
        return torch.softmax(z, -1), F.gelu(F.elu(y, 0.7)) * 2.0, z.var(-1)


class Compiled:
    """The compiled model, its graph text, manifest, weights, an input, its outputs and kernel
    source (a plain class: hypothesis prints a dataclass argument field by field)."""

    def __init__(self, root: Path, text: str, manifest: dict, weights: dict, x: torch.Tensor):
        self.root, self.text, self.manifest, self.weights, self.x = root, text, manifest, weights, x
        self.outputs: list = []
        self.source = ""

    def __repr__(self) -> str:
        return f"Compiled({self.root})"


class _View:
    """graph.dzir as edited, kernels.json with the hash the edit needs (an attacker computes it
    with this generator), and the manifest and weights under the names the edit gave them."""

    def __init__(self, case: Compiled, text: str, weights: dict, manifest: dict, folder: Path):
        self.root, self.text, self._weights = case.root, text, weights
        self.manifest, self.folder = manifest, folder

    def graph_text(self) -> str:
        return self.text

    def weights(self, framework: str = "np"):
        return self._weights

    def payload_path(self, relpath: str) -> Path:
        stored = json.loads((self.root / "backend" / relpath).read_text())
        try:
            stored["module_sha256"] = sha256(module_source(plan(parse_ir(self.text))))
        except DayzeroError:
            pass  # the loader refuses this text too
        path = self.folder / relpath
        path.write_text(json.dumps(stored))
        return path


def _run(case: Compiled, text: str, weights: dict | None = None,
         manifest: dict | None = None) -> tuple[object, str]:
    """(outputs, or the DayzeroError raised) and the kernel source the load wrote to its cache."""
    with tempfile.TemporaryDirectory() as folder:
        cache = Path(folder) / "cache"
        view = _View(case, text, case.weights if weights is None else weights,
                     case.manifest if manifest is None else manifest, Path(folder))
        try:
            result = TritonBackend().load(view, cache_dir=cache)([case.x.numpy()])
        except DayzeroError as exc:
            result = exc
        source = "".join(p.read_text() for p in sorted(cache.glob("k_*.py"))) \
            if cache.is_dir() else ""
    return result, source


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> Compiled:
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=16)
    root = compiler.compile(Hostile().eval(), (torch.randn(3, 8),),
                            out=tmp_path_factory.mktemp("hostile") / "m.dz", backend="triton",
                            dynamic_shapes=({0: batch},))
    manifest = json.loads((root / "manifest.json").read_text())
    weights = {}
    for rel in manifest["parallel"]["ranks"][0]["weights"]:
        weights.update(load_file(str(root / rel)))
    case = Compiled(root, (root / "graph.dzir").read_text(), manifest, weights,
                    torch.randn(5, 8, generator=torch.Generator().manual_seed(1)))
    result, case.source = _run(case, case.text)
    assert isinstance(result, list) and case.source.count("@triton.jit") >= 6
    case.outputs = result
    want = run_graph(parse_ir(case.text), weights, [case.x])
    for got, ref in zip(result, want):
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-4)
    return case


@pytest.fixture(autouse=True)
def _no_marker():
    MARKER.unlink(missing_ok=True)
    yield
    assert not MARKER.exists(), "a string planted in graph.dzir ran as code"


def _with_symbol(text: str, name: str) -> str:
    """The graph's one size symbol (s0, the batch) renamed."""
    assert re.search(r"\bs0\b", text)
    return re.sub(r"(?<![%@\w])s0\b", name, text)  # value names are other tokens


def _identifiers(source: str) -> set[str]:
    tree = ast.parse(source)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
        {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}


def _matches_reference(case: Compiled, text: str, weights: dict, result: object) -> None:
    """The outcome rule: a clean refusal, or the reference interpreter's outputs on the same
    graph (which must then run in eager too)."""
    if isinstance(result, DayzeroError):
        return
    graph = parse_ir(text)
    for node in graph.nodes:  # provenance only: the backends never read them, nor may eager
        for meta in META_ATTRS:
            node.attrs.pop(meta, None)
    try:
        want = run_graph(graph, weights, [case.x])
    except Exception as exc:  # noqa: BLE001 - eager refuses this graph; triton must refuse it too
        pytest.fail(f"triton ran a graph the reference refuses ({type(exc).__name__}: {exc})")
    assert len(result) == len(want)
    for got, ref in zip(result, want):
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-4, equal_nan=True)


# -- names --------------------------------------------------------------------------------------

@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_names_never_reach_the_source(case, data):
    """Any value, weight, symbol and graph name: the very same kernel text, the same outputs."""
    sym = data.draw(st.sampled_from(SYMBOLS))
    graph = parse_ir(_with_symbol(case.text, sym))
    values = list(graph.values())
    names = data.draw(st.lists(NAMES, min_size=len(values), max_size=len(values), unique=True))
    renamed = {v.name: new for v, new in zip(values, names)}
    weights = {renamed[name]: case.weights[name] for name in graph.weights}
    for value, new in zip(values, names):
        value.name = new
    graph.weights = {v.name: v for v in graph.weights.values()}
    graph.name = data.draw(NAMES)
    text = print_ir(graph)
    result, source = _run(case, text, weights, _renamed_plan(case.manifest, renamed))
    assert not isinstance(result, Exception), result
    assert source == case.source
    for got, want in zip(result, case.outputs):
        np.testing.assert_array_equal(got, want)


def _renamed_plan(manifest: dict, renamed: dict[str, str]) -> dict:
    """The manifest with its memory plan's value names renamed as the graph's were."""
    plan = json.loads(json.dumps(manifest["memory_plan"]))
    for entry in [*plan["buffers"], *plan["aliases"]]:
        entry["value"] = renamed[entry["value"]]
        if "root" in entry:
            entry["root"] = renamed[entry["root"]]
    plan["external"] = [renamed[v] for v in plan["external"]]
    return {**manifest, "memory_plan": plan}


# -- attributes ---------------------------------------------------------------------------------

def _attr_values(bound: str) -> st.SearchStrategy:
    s = symbol(bound)
    symbolic = [s, 2 * s, sympy.Max(s, 3), sympy.floor(s / 2), symbol("pwn_unbound")]
    scalars = st.sampled_from([*FLOATS, *INTS, *OTHERS, *CODE, *symbolic])
    return st.one_of(scalars, st.lists(scalars, max_size=3))


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_attributes_run_as_in_eager_or_are_refused(case, data):
    sym = data.draw(st.sampled_from(SYMBOLS))
    graph = parse_ir(_with_symbol(case.text, sym))
    targets = [n for n in graph.nodes if n.op in ATTRIBUTES]
    for _ in range(data.draw(st.integers(1, 2))):
        node = data.draw(st.sampled_from(targets))
        attr = data.draw(st.sampled_from([*OPS[node.op].attrs, "fusion_group", "origin"]))
        node.attrs[attr] = data.draw(_attr_values(sym))
        if data.draw(st.booleans()):
            node.loc = data.draw(st.sampled_from(CODE))
    if "pwn_unbound" in print_ir(graph):
        graph.symbols["pwn_unbound"] = (1, 8)
    text = print_ir(graph)
    note("\n".join(line for line in text.splitlines() if line not in case.text))
    result, source = _run(case, text)
    event(f"outcome: {type(result).__name__}")  # --hypothesis-show-statistics: ran or refused
    _matches_reference(case, text, case.weights, result)
    assert "pwn" not in source
    new_names = (_identifiers(source) - _identifiers(case.source)) if source else set()
    assert sym not in new_names, f"symbol {sym} reached the kernel source"
    for name in new_names:  # only the generator's indexed identifiers (x3, v2_m, se1_n, ...)
        assert re.fullmatch(r"[a-z]{1,3}[0-9]+(_[a-z0-9]+)?", name), name


def _edit(case: Compiled, old: str, new: str, sym: str | None = None) -> str:
    text = _with_symbol(case.text, sym) if sym else case.text
    assert text.count(old) == 1, old
    return text.replace(old, new)


def test_a_symbol_named_like_a_kernel_local_is_not_read_as_one(case):
    """`beta=x0` with the batch symbol named x0: the kernel's x0 is its first loaded operand, so
    writing the attribute's text made softplus's beta that tensor (silently wrong values)."""
    text = _edit(case, "beta=2.0", "beta=x0", sym="x0")
    result, source = _run(case, text)
    assert isinstance(result, list), result
    _matches_reference(case, text, case.weights, result)
    assert "softplus" in text and "tl.log(1.0 + tl.exp(" not in source  # beta is symbolic:
    # softplus runs on the host, where x0 has its value (5)


@pytest.mark.parametrize("attr,value", [
    ("beta", "nan"), ("beta", "inf"), ("threshold", "-inf"), ("negative_slope", "nan"),
    ("alpha", "inf"), ("eps", "nan"), ("correction", "inf"), ("min", "nan"), ("max", "-inf")])
def test_nan_and_infinite_attributes_run_as_in_eager(case, attr, value):
    old = next(m.group(0) for m in re.finditer(rf"\b{attr}=[^,}}]+", case.text))
    text = _edit(case, old, f"{attr}={value}")
    result, source = _run(case, text)
    assert isinstance(result, list), result
    _matches_reference(case, text, case.weights, result)
    assert f"float('{value}')" in source


@pytest.mark.parametrize("old,new", [
    ("beta=2.0", f'beta={json.dumps(CODE[1])}'),
    ("beta=2.0", "beta=f32"),
    ("beta=2.0", "beta=true"),
    ("beta=2.0", "beta=[2.0]"),
    ("threshold=10.0", 'threshold="10.0"'),
    ("eps=1e-05", 'eps="1e-5"'),
    ("min=-0.5", 'min="-0.5"'),
    ("negative_slope=0.1", "negative_slope=none"),
    ("alpha=0.7", "alpha=[0.7]"),
    ("correction=1", 'correction="1"'),
    ("dim=-1", "dim=2"),
    ("dim=-1", "dim=true"),
    ("dims=[-1]", "dims=[-1, 1]"),
    ("keepdim=false", "keepdim=0"),
    ('approximate="none"', f'approximate={json.dumps(CODE[2])}'),
], ids=lambda text: text.replace(str(MARKER), "MARKER"))  # the same ids in every xdist worker
def test_attributes_of_the_wrong_kind_are_refused_at_load(case, old, new):
    """Values the IR parser accepts (it does not type these attributes) but no kernel can take:
    today's generator wrote their text (a string literal, `DType.f32`, `True`, a list) or read
    them as something else (dim=true as axis 1); they are refused before anything runs."""
    text = _edit(case, old, new)
    result, source = _run(case, text)
    assert isinstance(result, ArtifactError), result
    assert "graph.dzir" in result.where and "recompile" in result.fix
    assert source == ""


# -- the last gate: the module is checked before it runs ----------------------------------------

def test_an_unsafe_module_is_never_executed(case, monkeypatch):
    """Were the generator ever to write something else (a bug, a path not thought of), the
    module is refused before exec: a top-level statement that would create a file never runs."""
    evil = f"{module_source(plan(parse_ir(case.text)))}\nopen({str(MARKER)!r}, 'w').close()\n"
    monkeypatch.setattr(triton_backend, "module_source", lambda steps: evil)

    class View(_View):
        def payload_path(self, relpath):
            stored = json.loads((self.root / "backend" / relpath).read_text())
            path = self.folder / relpath
            path.write_text(json.dumps({**stored, "module_sha256": sha256(evil)}))
            return path

    with tempfile.TemporaryDirectory() as folder:
        view = View(case, case.text, case.weights, case.manifest, Path(folder))
        with pytest.raises(ArtifactError, match="safety check"):
            TritonBackend().load(view, cache_dir=Path(folder) / "cache")
    assert not MARKER.exists()


def _module(case: Compiled) -> str:
    return module_source(plan(parse_ir(case.text)))


def test_every_kernel_the_fixture_generates_passes_the_check(case):
    check_source(_module(case))  # elementwise, row and GEMM kernels


# (the line to find in the generated module, what to put in its place)
REFUSED = [
    ("import triton.language as tl", "import triton.language as tl\nimport os"),
    ("import triton\n", "from os import system\nimport triton\n"),
    ("    v0 = (x0 * x1)", "    v0 = __import__('os').system('true')"),
    ("    v0 = (x0 * x1)", "    v0 = open('f')"),
    ("    v0 = (x0 * x1)", "    v0 = x0.__class__"),
    ("    v0 = (x0 * x1)", "    v0 = tl.load.__globals__"),
    ("    v0 = (x0 * x1)", "    v0 = x0 * 'pwn'"),
    ("    v0 = (x0 * x1)", "    v0 = float('1e3')"),
    ("    v0 = (x0 * x1)", "    v0 = (lambda: x0)()"),
    ("    v0 = (x0 * x1)", "    v0 = [x0][0]"),
    ("    v0 = (x0 * x1)", "    v0 = f'{x0}'"),
    ("    v0 = (x0 * x1)", "    v0 = getattr(tl, 'load')"),
    ("    v0 = (x0 * x1)", "    v0 = tl.extra"),
    ("    v0 = (x0 * x1)", "    v0 = os"),
    ("    v0 = (x0 * x1)", "    global x9\n    v0 = x0"),
    ("    v0 = (x0 * x1)", "    while True:\n        v0 = x0"),
    ("    v0 = (x0 * x1)", "    v0 = tl.where(x0 > 0, x0, x1, **{})"),
    ("    v0 = (x0 * x1)", "    v0 = tl.load(in0, evil=1)"),
    ("    v0 = (x0 * x1)", "    open = x0\n    v0 = open"),
    ("    v0 = (x0 * x1)", "    system = x0\n    v0 = system"),
    ("    v0 = (x0 * x1)", "    v0 = x0 if x1 else x0"),
    ("@triton.jit\ndef k0_mul(", "@triton.jit(debug=True)\ndef k0_mul("),
    ("@triton.jit\ndef k0_mul(", "@triton.jit\ndef pwn("),
    ("def k0_mul(in0,", "def k0_mul(in0=__import__('os'),"),
    ("def k0_mul(in0,", "def k0_mul(*in0,"),
    ("BLOCK: tl.constexpr):\n    offs", "BLOCK: print('pwn')):\n    offs"),
]


@pytest.mark.parametrize("where,replacement", REFUSED)
def test_the_check_refuses_what_the_generator_never_writes(case, where, replacement):
    module = _module(case)
    assert module.count(where) >= 1, where
    with pytest.raises(ArtifactError, match="safety check"):
        check_source(module.replace(where, replacement, 1))


def test_the_check_refuses_a_kernel_defined_twice(case):
    module = _module(case)
    first = module.split("\n\n\n")[1]
    with pytest.raises(ArtifactError, match="defined twice"):
        check_source(module + "\n\n" + first)


# -- end to end: runtime.load of an edited artifact ----------------------------------------------

def test_an_edited_artifact_with_planted_code_is_refused_by_runtime_load(case, tmp_path,
                                                                         monkeypatch):
    import shutil

    root = Path(shutil.copytree(case.root, tmp_path / "m.dz"))
    text = _edit(case, 'approximate="none"', f"approximate={json.dumps(CODE[0])}")
    (root / "graph.dzir").write_text(text)
    listing = json.loads((root / "backend" / "kernels.json").read_text())
    (root / "backend" / "kernels.json").write_text(json.dumps(listing))
    manifest = json.loads((root / "manifest.json").read_text())
    for rel in ("graph.dzir", "backend/kernels.json"):
        data = (root / rel).read_bytes()
        manifest["files"][rel] = {"size": len(data), "sha256": sha256(data.decode())}
    (root / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setenv("DAYZERO_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(DayzeroError):
        runtime.load(root)
    assert not MARKER.exists()
    assert not list((tmp_path / "cache").rglob("k_*.py"))


# -- NaN through maximum and minimum (found by the attribute property: clamp with min=nan) ----

class MaxMin(nn.Module):
    def forward(self, x, y):
        return (torch.relu(x), x.clamp(-0.5, 0.5), torch.maximum(x, y), torch.minimum(x, y),
                F.hardsigmoid(x), F.hardswish(x))


def test_nan_propagates_through_maximum_minimum_and_clamp_as_in_eager(tmp_path):
    """Triton's maximum/minimum return the other operand of a NaN by default; torch's propagate
    it (relu(nan) is nan, not 0)."""
    nan = math.nan
    x = torch.tensor([nan, 1.0, -1.0, nan, 0.25, -nan])
    y = torch.tensor([0.0, nan, -2.0, nan, 3.0, 1.0])
    path = compiler.compile(MaxMin(), (x, y), out=tmp_path / "m.dz", backend="triton")
    got = runtime.load(path)(x, y)
    for g, want in zip(got, MaxMin()(x, y)):
        np.testing.assert_allclose(g, want.numpy(), rtol=1e-6, atol=0)  # NaN where eager's is
