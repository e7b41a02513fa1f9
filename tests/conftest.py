"""Fixtures shared by the whole suite. Kept small: per-area helpers live next to their tests."""

from __future__ import annotations

import os
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

# test modules import onnxruntime directly: its telemetry must be off before the first import
# (backends/onnxruntime/ort_module.py), or test runs write into the developer's HOME
os.environ["ORT_DISABLE_TELEMETRY"] = "1"

import torch  # noqa: E402

# Triton kernels run in Triton's interpreter without CUDA. The choice must be made before anything
# imports triton (torch.export and transformers do), so it is made here, before any test module.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from hypothesis import HealthCheck, settings

# pytest puts this folder on sys.path, and its subfolders are named like the packages they test
# (tests/compiler, tests/runtime, ...). The editable install finds packages only after sys.path
# is searched, so those folders would shadow the real packages as namespace packages; with the
# repository root on sys.path the real (regular) packages always win.
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)

import backends  # noqa: E402
from compiler.ir import Graph, parse_ir, print_ir, verify  # noqa: E402

# CI machines are slow and shared: a property test must not fail on timing alone.
settings.register_profile("dayzero", deadline=None, max_examples=60,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("dayzero")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--sweep", action="store_true",
                     help="run the long sweeps (every OpInfo op) whole; without it, the fixed "
                          "sample CI runs (tests/sweeps.py)")


# -- time budgets --------------------------------------------------------------------------------
# Seconds of test time (setup + call + teardown, summed over xdist workers) each area of the suite
# may take on a quiet 2-core machine; CI's whole run must stay well under 30 minutes. The summary
# at the end of every run prints each area against its budget (a report, not a timed test: the
# machine is shared and noisy). An area over budget moves its long cases to a sweep
# (tests/sweeps.py) or makes them cheaper.
AREA_BUDGETS: dict[str, float] = {  # measured 2026-12-01 in a clean-clone .ci/run, +20-30%
    # 391 s: Triton's interpreter on whole models, the ORT conformance; + MoE routing models
    # (Qwen2-MoE, DeepSeek-V2/V3) and the packed PagedAttention: 355 s in a clean-clone run
    "tests/backends": 480.0,
    # 358 s: the OpInfo sample, the frontend's transformers models; + MoE checkpoint folders
    "tests/compiler": 480.0,  # 404 s in a clean-clone run, 2026-12-02
    # 162 s (2026-12-02): two-rank launches, the installed runtime; + about 50 s for the
    # expert-parallel Mixtral (one export, two launches: 116 s with the machine shared, load ~11)
    "tests/runtime": 250.0,
    # 158 s (2026-12-02) with DeepSeek-V2/V3 latent-cache generation; 281 s (2026-12-03, the
    # machine shared) with the attention-op models, generation configs and prefix caching
    "tests/generation": 330.0,
    "tests/passes": 210.0,  # 175 s (2026-12-02): Mistral, Gemma 2, Phi-3 compiled per backend
    "tests/serving": 120.0,
    "tests/tools": 60.0,
    "tests/regression": 40.0,
    # 20.3 s (2026-12-02) with the DeepSeek-shaped moe harness; 31 s (2026-12-03) with the
    # generation-sweep and fuzz harnesses
    "tests/benchmarks": 45.0,
    # 15 transformers architectures compiled on onnxruntime (benchmarks/architecture_sweep.py's
    # fixed sample): 143 s on 2026-12-02 (load ~3), 420 s with the machine shared (load ~13)
    "tests/architectures": 240.0,
    "tests/*.py": 200.0,  # end to end: non-finite values on every backend, the docs' commands
}
_area_seconds: dict[str, float] = defaultdict(float)


def _area(nodeid: str) -> str:
    parts = nodeid.split("::", 1)[0].split("/")
    return "tests/*.py" if len(parts) == 2 else "/".join(parts[:2])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _area_seconds[_area(report.nodeid)] += report.duration


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _area_seconds:
        return
    write = terminalreporter.write_line
    terminalreporter.section("time by area (seconds of test time, against AREA_BUDGETS)")
    for area, seconds in sorted(_area_seconds.items(), key=lambda kv: -kv[1]):
        budget = AREA_BUDGETS.get(area)
        verdict = "no budget" if budget is None else ("OVER BUDGET" if seconds > budget else "ok")
        write(f"{area:<32} {seconds:8.1f} / {budget or 0:6.0f}  {verdict}")
    write(f"{'total':<32} {sum(_area_seconds.values()):8.1f} / {sum(AREA_BUDGETS.values()):6.0f}")


def _roundtrip(graph_or_text: Graph | str) -> Graph:
    """Print, parse and print again; assert the two texts match and both graphs verify."""
    text = graph_or_text if isinstance(graph_or_text, str) else print_ir(graph_or_text)
    if isinstance(graph_or_text, Graph):
        verify(graph_or_text)
    parsed = parse_ir(text)
    verify(parsed)
    again = print_ir(parsed)
    assert again == text, f"round trip changed the text:\n--- first\n{text}--- second\n{again}"
    return parsed


@pytest.fixture
def roundtrip():
    """`roundtrip(graph or text) -> parsed Graph`; asserts print -> parse -> print is identical."""
    return _roundtrip


# -- the example backend plugin in tests/plugin ---------------------------------------------------
# The tests never install it: a user who ran them must not find a test backend in `dayzero
# backends` or a column of MISSING in every coverage table. Tests that need it register it with
# the `testplugin` fixture; the entry-point discovery tests give it a distribution's metadata in a
# temporary site folder (`plugin_site`), as pip would have written it.
PLUGIN_SOURCE = Path(__file__).resolve().parent / "plugin"


def plugin_entry_points() -> dict[str, str]:
    """The plugin's `dayzero.backends` entry points, as its pyproject.toml declares them."""
    project = tomllib.loads((PLUGIN_SOURCE / "pyproject.toml").read_text())["project"]
    return dict(project["entry-points"][backends.ENTRY_POINT_GROUP])


def write_plugin_distribution(site: Path) -> Path:
    """Installed-distribution metadata for tests/plugin in `site` (a folder to put on sys.path
    next to PLUGIN_SOURCE): what importlib.metadata reads to find entry points."""
    project = tomllib.loads((PLUGIN_SOURCE / "pyproject.toml").read_text())["project"]
    info = site / f"dayzero_testplugin-{project['version']}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\n"
                                   f"Version: {project['version']}\n")
    lines = [f"[{backends.ENTRY_POINT_GROUP}]"]
    lines += [f"{name} = {ref}" for name, ref in plugin_entry_points().items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return site


@pytest.fixture
def testplugin(monkeypatch):
    """The example plugin registered as backend `testplugin` for one test."""
    monkeypatch.syspath_prepend(str(PLUGIN_SOURCE))
    backends.register("testplugin", plugin_entry_points()["testplugin"])
    yield "testplugin"
    backends.unregister("testplugin")


@pytest.fixture
def plugin_site(tmp_path, monkeypatch):
    """The example plugin as an installed distribution on sys.path (entry point and all); the
    returned paths also go to a subprocess's PYTHONPATH."""
    site = write_plugin_distribution(tmp_path / "site")
    for path in (site, PLUGIN_SOURCE):
        monkeypatch.syspath_prepend(str(path))
    return [str(site), str(PLUGIN_SOURCE)]
