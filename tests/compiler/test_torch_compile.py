"""`torch.compile(model, backend="dayzero")`: the TorchDynamo backend, against eager.

Each test resets dynamo (its caches would otherwise hand one test's compiled graphs to the next)
and gives the backend its own cache folder through DAYZERO_CACHE_DIR.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.numerics import assert_fp32_close
from tests.test_end_to_end import build

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_dynamo(tmp_path, monkeypatch):
    monkeypatch.setenv("DAYZERO_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def artifacts(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "torch_compile").glob("*/model.dz"))


def test_the_backend_is_found_by_name():
    assert "dayzero" in torch._dynamo.list_backends()


@pytest.mark.parametrize("name", ["mlp", "llama", "gpt2", "bert"])
def test_example_models_match_eager(name, tmp_path):
    model, inputs, _ = build(name)
    with torch.no_grad():
        want = model(*inputs)
        got = torch.compile(model, backend="dayzero")(*inputs)
    for g, w in zip(_flat(got), _flat(want)):
        assert isinstance(g, torch.Tensor) and g.dtype == w.dtype
        assert_fp32_close(g.numpy(), w.numpy())
    assert len(artifacts(tmp_path)) >= 1


def _flat(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [v for v in x.values() if isinstance(v, torch.Tensor)]
    return [t for item in x for t in _flat(item)]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)
        self.register_buffer("shift", torch.linspace(-1, 1, 32))

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x) + self.shift))


def test_a_dynamic_dim_serves_every_size_with_one_artifact(tmp_path):
    model = Net().eval()
    compiled = torch.compile(model, backend="dayzero")
    x = torch.randn(2, 5, 16)
    torch._dynamo.mark_dynamic(x, 1)
    with torch.no_grad():
        assert_fp32_close(compiled(x).numpy(), model(x).numpy())
        for seq in (9, 33, 2):
            y = torch.randn(2, seq, 16)
            assert_fp32_close(compiled(y).numpy(), model(y).numpy())
    assert len(artifacts(tmp_path)) == 1


def test_automatic_dynamic_shapes_recompile_once_then_serve_every_size(tmp_path):
    """Without mark_dynamic, dynamo compiles the first size static and the second dynamic."""
    model = Net().eval()
    compiled = torch.compile(model, backend="dayzero")
    with torch.no_grad():
        for seq in (4, 7, 12, 30):
            y = torch.randn(3, seq, 16)
            assert_fp32_close(compiled(y).numpy(), model(y).numpy())
    assert len(artifacts(tmp_path)) == 2


class Sorted(nn.Module):
    """torch.cummax has no dayzero converter: it stays in eager between two compiled regions."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        values, _ = torch.cummax(self.fc1(x).relu(), dim=-1)
        return self.fc2(values).tanh()


def test_unsupported_ops_run_in_eager_between_compiled_regions(tmp_path, caplog):
    model = Sorted().eval()
    x = torch.randn(3, 8)
    with torch.no_grad(), caplog.at_level(logging.WARNING, "dayzero.torch_compile"):
        got = torch.compile(model, backend="dayzero")(x)
        want = model(x)
    assert_fp32_close(got.numpy(), want.numpy())
    (line,) = [r.getMessage() for r in caplog.records]
    assert "aten.cummax" in line and "2 region(s) compiled" in line
    assert len(artifacts(tmp_path)) == 2


class Breaks(nn.Module):
    """A data-dependent branch: dynamo splits the forward into two graphs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc1(x)
        if h.sum().item() > 0:
            h = h * 2
        return self.fc2(h).sigmoid()


def test_graph_breaks_compile_each_graph(tmp_path):
    model = Breaks().eval()
    compiled = torch.compile(model, backend="dayzero")
    with torch.no_grad():
        for seed in range(3):
            x = torch.randn(4, 8, generator=torch.Generator().manual_seed(seed))
            assert_fp32_close(compiled(x).numpy(), model(x).numpy())
    assert len(artifacts(tmp_path)) >= 2


def test_a_second_process_starts_warm(tmp_path):
    """The artifact is cached on disk by graph, weights, options and versions: a second process
    loads it instead of compiling."""
    code = textwrap.dedent(f"""
        import logging, sys, torch
        sys.path.insert(0, {str(ROOT)!r})
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        from tests.compiler.test_torch_compile import Net
        torch.manual_seed(0)
        model = Net().eval()
        with torch.no_grad():
            out = torch.compile(model, backend="dayzero")(torch.ones(2, 16))
            print("DIFF", float((out - model(torch.ones(2, 16))).abs().max()))
    """)
    env = {**__import__("os").environ, "DAYZERO_CACHE_DIR": str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, timeout=300) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
        assert float(run.stdout.split("DIFF")[1]) <= 1e-5
    assert "dayzero: compiled" in runs[0].stderr and "from the cache" not in runs[0].stderr
    assert "from the cache" in runs[1].stderr and "dayzero: compiled" not in runs[1].stderr


def test_other_weights_get_another_artifact(tmp_path):
    with torch.no_grad():
        for seed in (0, 1):
            model = Net().eval()
            torch.manual_seed(seed)
            model.fc2.weight.normal_()
            x = torch.randn(2, 16)
            assert_fp32_close(torch.compile(model, backend="dayzero")(x).numpy(),
                              model(x).numpy())
            torch._dynamo.reset()
    assert len(artifacts(tmp_path)) == 2


def test_training_is_refused_with_a_clear_message():
    model = Net()
    with pytest.raises(Exception, match="inference only"):
        torch.compile(model, backend="dayzero")(torch.randn(2, 16))


def test_unknown_options_are_named():
    with torch.no_grad(), pytest.raises(Exception, match="unknown torch.compile option.*speed"):
        torch.compile(Net().eval(), backend="dayzero", options={"speed": 3})(torch.randn(2, 16))


def test_options_choose_the_backend(tmp_path):
    model = Net().eval()
    x = torch.randn(2, 16)
    with torch.no_grad():
        got = torch.compile(model, backend="dayzero", options={"backend": "reference"})(x)
        assert_fp32_close(got.numpy(), model(x).numpy())
    (artifact,) = artifacts(tmp_path)
    assert json.loads((artifact / "manifest.json").read_text())["backend"] == "reference"


OPS = {  # a few OpInfo-style ops, each as a one-line module
    "add": lambda a, b: a + b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
    "exp": lambda a, b: torch.exp(a) - b, "softmax": lambda a, b: torch.softmax(a * b, -1),
    "matmul": lambda a, b: a @ b.transpose(-1, -2), "layer_norm":
    lambda a, b: torch.nn.functional.layer_norm(a + b, (a.shape[-1],)),
    "where": lambda a, b: torch.where(a > b, a, b), "amax": lambda a, b: (a - b).amax(-1),
    "erf": lambda a, b: torch.erf(a) * b,
}


class Op(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, a, b):
        return self.fn(a, b)


@pytest.mark.parametrize("name", sorted(OPS))
def test_single_ops_match_eager(name):
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(3, 5, 7, generator=gen), torch.randn(3, 5, 7, generator=gen)
    a[0, 0, 0], b[1, 2, 3] = float("nan"), float("inf")
    model = Op(OPS[name])
    with torch.no_grad():
        got, want = torch.compile(model, backend="dayzero")(a, b), model(a, b)
    assert_fp32_close(got.numpy(), want.numpy())


# OpInfo's samples, through torch.compile: each op's float32 samples in one module, as
# test_opinfo.py builds them; sort has no converter, so it exercises the eager partition.
OPINFO_SUBSET = ["add", "mul", "div.no_rounding_mode", "exp", "rsqrt", "sigmoid", "tanh",
                 "where", "clamp", "matmul", "softmax", "nn.functional.layer_norm",
                 "nn.functional.gelu", "nn.functional.silu", "cat", "permute", "mean", "amax",
                 "cumsum", "sort"]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", OPINFO_SUBSET)
def test_opinfo_samples_through_torch_compile(name):
    from torch.testing._internal.common_methods_invocations import op_db

    from tests.compiler.test_opinfo import SamplesModule, eager_outputs, float32_samples

    op_name, _, variant = name.partition(".no_")
    variant = f"no_{variant}" if variant else ""
    op = next(o for o in op_db if o.name == op_name and o.variant_test_name == variant)
    module = SamplesModule(op.op, float32_samples(op, 3))
    want = eager_outputs(module)
    assert not isinstance(want, str), want
    with torch.no_grad():
        got = torch.utils._pytree.tree_leaves(
            torch.compile(module, backend="dayzero")(*module.inputs))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5, equal_nan=True)
