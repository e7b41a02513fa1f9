"""Dynamic shapes torch.export refuses: retried with torch's suggested fixes (a relation, a
range), or, where the model fixes the dim to a constant (Mamba's sequence), compiled at several
static sizes into one artifact that runs the size it is given."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
import transformers
from torch.export import Dim

import compiler
import runtime
from compiler.errors import ArtifactError, InputError
from compiler.log import StageLog
from compiler.static_sizes import choose_sizes, resized
from runtime.sized import SizedModel


class PairRows(torch.nn.Module):
    """Folds pairs of positions into one: seq must be even, which torch.export finds out and
    suggests as `seq = 2*_seq`."""

    def forward(self, x):
        b, s, d = x.shape
        return torch.tanh(x.reshape(b, s // 2, 2 * d)) * 2


class Window(torch.nn.Module):
    """Adds a 24-row table cut to the sequence: seq can be at most 24 (a range fix)."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(24, 4))

    def forward(self, x):
        return x + self.table[: x.shape[1]]


def _compile(model, inputs, dynamic_shapes, out, **kwargs):
    stream = io.StringIO()
    path = compiler.compile(model, inputs, out=out, dynamic_shapes=dynamic_shapes,
                            log=StageLog(stream), **kwargs)
    return path, stream.getvalue()


def test_a_relation_torch_suggests_is_compiled_and_reported(tmp_path):
    path, log = _compile(PairRows(), (torch.randn(1, 16, 4),),
                         ({1: Dim("seq", min=2, max=64)},), tmp_path / "pairs.dz")
    fixes = ["_seq = Dim('_seq', min=1, max=32)", "seq = 2*_seq"]
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["export_refinements"] == {"fixes": fixes, "ranges": {"s0": [2, 32]}}
    assert ("applied its suggested fixes: _seq = Dim('_seq', min=1, max=32); seq = 2*_seq; "
            "compiled ranges: s0 in [2, 32]") in log
    m = runtime.load(path)
    assert m.input_specs[0].shape == (1, "2*s0", 4)
    for n in (4, 10, 64):
        x = torch.randn(1, n, 4)
        np.testing.assert_allclose(m(x)[0], PairRows()(x).numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match=r"dim 1 is 11 but must be 2\*s0 for a whole s0 in "
                                         r"\[2, 32\]"):
        m(torch.randn(1, 11, 4))


def test_a_range_torch_suggests_is_compiled_and_reported(tmp_path):
    model = Window()
    path, log = _compile(model, (torch.randn(1, 8, 4),), ({1: Dim("seq", min=1, max=64)},),
                         tmp_path / "window.dz")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["export_refinements"]["fixes"] == ["seq = Dim('seq', max=24)"]
    assert "compiled ranges: s0 (seq) in [1, 24]" in log
    m = runtime.load(path)
    for n in (3, 24):
        x = torch.randn(1, n, 4)
        np.testing.assert_allclose(m(x)[0], model(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match="must be in"):
        m(torch.randn(1, 25, 4))


class LastHidden(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(ids, use_cache=False).last_hidden_state


def test_mamba_compiles_at_static_sizes_and_runs_the_one_that_fits(tmp_path):
    """transformers' Mamba unrolls its scan over the sequence: torch.export's fix is `seq = 8`.
    The artifact holds seq 4 and 8, each matching eager; seq 6 runs padded to 8 (the scan is
    causal), seq 9 is past the largest size."""
    cfg = transformers.MambaConfig(hidden_size=16, num_hidden_layers=1, state_size=4,
                                   vocab_size=64, expand=2, conv_kernel=4)
    torch.manual_seed(0)
    model = LastHidden(transformers.MambaModel(cfg).eval()).eval()
    ids = torch.randint(0, 64, (1, 8))
    path, log = _compile(model, (ids,), ({1: Dim("seq", min=2, max=64)},),
                         tmp_path / "mamba.dz", static_sizes=[4])
    assert ("torch.export finds no graph dynamic in seq (the example has seq = 8); "
            "compiling static sizes seq = 4, 8") in log
    m = runtime.load(path)
    assert isinstance(m, SizedModel) and m.sizes == [4, 8]
    assert m.manifest["static_sizes"]["sizes"] == [{"size": 4, "path": "sizes/seq-4"},
                                                   {"size": 8, "path": "."}]
    for n in (4, 8):
        x = torch.randint(0, 64, (1, n))
        with torch.no_grad():
            expected = model(x).numpy()
        np.testing.assert_allclose(m(x)[0], expected, rtol=1e-5, atol=1e-5)
    # the scan is causal: seq 6 runs at 8, padded on the right, and is cut back to 6
    assert m.manifest["static_sizes"]["padding"] == {"side": "right", "outputs": [[0, 1]]}
    x = torch.randint(0, 64, (1, 6))
    with torch.no_grad():
        expected = model(x).numpy()
    got = m(x)[0]
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(InputError, match=r"seq = 9: this artifact runs seq up to 8"):
        m(torch.randint(0, 64, (1, 9)))


class Unrolled(torch.nn.Module):
    """A scan unrolled over the sequence (torch.export fixes seq); `look_ahead` also adds the
    sequence's mean to every position, so padding changes the earlier outputs."""

    def __init__(self, look_ahead: bool):
        super().__init__()
        self.look_ahead = look_ahead

    def forward(self, x):
        state, outs = torch.zeros_like(x[:, 0]), []
        for i in range(x.shape[1]):
            state = torch.tanh(state * 0.5 + x[:, i])
            outs.append(state)
        y = torch.stack(outs, dim=1)
        return y + y.mean(dim=1, keepdim=True) if self.look_ahead else y


@pytest.mark.parametrize("look_ahead", [False, True], ids=["causal", "look-ahead"])
def test_a_size_between_the_compiled_ones_runs_padded_only_where_that_is_exact(tmp_path,
                                                                            look_ahead):
    model = Unrolled(look_ahead)
    x = torch.randn(2, 8, 3)
    path, log = _compile(model, (x,), ({1: Dim("seq", min=2, max=32)},), tmp_path / "u.dz",
                         static_sizes=[4, 8])
    m = runtime.load(path)
    short = torch.randn(2, 5, 3)
    if look_ahead:
        assert "padding" not in m.manifest["static_sizes"]
        assert "padding changes earlier positions' outputs" in log
        with pytest.raises(InputError, match=r"seq = 5: this artifact runs seq = 4, 8 only"):
            m(short)
        return
    assert "a size between them runs padded on the right" in log
    np.testing.assert_allclose(m(short)[0], model(short).numpy(), rtol=1e-5, atol=1e-6)


def test_sizes_chosen_by_default_are_the_example_and_its_nearest_powers_of_two():
    assert choose_sizes(8, 2, 64) == [2, 4, 8, 16]
    assert choose_sizes(12, 1, 16) == [4, 8, 12, 16]
    assert choose_sizes(5, 4, None, count=2) == [4, 5]


def test_resized_inputs_repeat_or_cut_the_example_along_the_dim():
    ids = torch.tensor([[1, 2, 3]])
    assert resized((ids,), [(0, 1)], 7)[0].tolist() == [[1, 2, 3, 1, 2, 3, 1]]
    assert resized((ids,), [(0, 1)], 2)[0].tolist() == [[1, 2]]


class _Top:
    def __init__(self, entry, path):
        self.manifest = {"static_sizes": entry}
        self.path = path
        self.input_specs = self.output_specs = []


@pytest.mark.parametrize("entry", [
    {"dim": "seq", "inputs": [[0, 1]], "sizes": [{"size": 4, "path": "../elsewhere"}]},
    {"dim": "seq", "inputs": [[0, 1]], "sizes": [{"size": 4, "path": "/abs"}]},
    {"dim": "seq", "inputs": [["ids", 1]], "sizes": [{"size": 4, "path": "."}]},
    {"dim": "seq", "inputs": [[0, 1]], "sizes": [{"size": 4, "path": "."}],
     "padding": {"side": "left", "outputs": [[0, 1]]}},
    {"dim": "seq", "inputs": [[0, 1]], "sizes": [{"size": 4, "path": "."}],
     "padding": {"side": "right", "outputs": [[0, 10 ** 9]]}},
])
def test_a_static_sizes_section_pointing_outside_the_artifact_is_refused(tmp_path, entry):
    with pytest.raises(ArtifactError, match="static_sizes"):
        SizedModel(_Top(entry, tmp_path), "full", None, None)


@pytest.mark.parametrize("value", ["a,b", "0,4", ""])
def test_static_sizes_option_takes_positive_sizes(tmp_path, capsys, value):
    from compiler.cli import main

    with pytest.raises(SystemExit) as info:
        main(["compile", "x.py:build", "-o", str(tmp_path / "m.dz"), "--static-sizes", value])
    assert info.value.code == 2
    assert "is not a list of sizes; write e.g. 4,8,16" in capsys.readouterr().err


def test_a_violation_without_fixes_names_its_dims_at_the_example_sizes():
    """Mamba2's chunked scan: torch lists guards such as `seq % 8 == 0` but states no fix; the
    dims it names are compiled like constants, at the example's size."""
    from compiler.frontend.refine import constrained_dims

    message = ("Constraints violated (seq)! For more information, run with TORCH_LOGS=...\n"
               "  - Not all values of seq = L['ids'].size()[1] in the specified range seq <= 64 "
               "satisfy the generated guard ((L['ids'].size()[1]) % 8) == 0.\n")
    shapes = ({1: Dim("seq", min=2, max=64)},)
    ids = torch.zeros(1, 12, dtype=torch.long)
    assert constrained_dims(Exception(message), PairRows(), (ids,), shapes) == {"seq": 12}
    with_fix = message + "Suggested fixes:\n  seq = 12\n"
    assert constrained_dims(Exception(with_fix), PairRows(), (ids,), shapes) == {}
    assert constrained_dims(Exception("data-dependent"), PairRows(), (ids,), shapes) == {}
