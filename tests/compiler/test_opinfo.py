"""OpInfo conformance: every op in torch's op_db, exported, converted and run against eager.

For each OpInfo, up to `MAX_SAMPLES` float32 CPU samples are wrapped in a module whose inputs are
the sample's tensors (everything else is baked in), exported with `compiler.export` and run with
the reference interpreter. An op the IR lacks, or one torch.export cannot trace, is skipped with
the reason; an op that converts must match eager within 1e-5 (looser only per `TOLERANCES`).
Reproduce the counts in docs/ops.md with `pytest tests/compiler/test_opinfo.py -n 2 -q`.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.utils._pytree as pytree
from torch.testing._internal.common_methods_invocations import op_db

import compiler
from backends.reference.interpreter import run_graph
from compiler.errors import DayzeroError
from compiler.frontend import UnsupportedOpsError
from compiler.ir import parse_ir, print_ir
from tests.sweeps import sweep

MAX_SAMPLES = 4

# op name -> (atol, rtol, why eager and the IR's reference may differ more than 1e-5)
_DFT = (1e-4, 1e-4, "the IR's DFT is a matmul: its sums run in another order than pocketfft's")
TOLERANCES: dict[str, tuple[float, float, str]] = {
    name: _DFT for name in ("fft.fft", "fft.fft2", "fft.fftn", "fft.ifft", "fft.ifft2",
                            "fft.ifftn", "fft.rfft", "fft.rfft2", "fft.rfftn", "fft.irfft",
                            "fft.irfft2", "fft.irfftn", "fft.hfft", "fft.hfft2", "fft.hfftn",
                            "fft.ihfft", "fft.ihfft2", "fft.ihfftn")}

# ops whose eager result is not a function of the inputs, so no comparison can be made
NOT_COMPARABLE = {
    "empty": "uninitialized memory", "empty_like": "uninitialized memory",
    "new_empty": "uninitialized memory", "empty_strided": "uninitialized memory",
    "new_empty_strided": "uninitialized memory", "empty_permuted": "uninitialized memory",
}


class SamplesModule(torch.nn.Module):
    """Calls `fn` on each sample, whose tensors arrive as forward() arguments; returns a tuple
    of the results. Several samples in one module make one export instead of several."""

    def __init__(self, fn, samples: list):
        super().__init__()
        self.fn = fn
        self.templates = []  # (pytree spec, leaves with non-tensors baked in, tensor slots)
        self.inputs: list[torch.Tensor] = []
        for sample in samples:
            leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
            slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
            self.templates.append((spec, leaves, slots))
            self.inputs += [leaves[i] for i in slots]

    def forward(self, *tensors):
        results, given = [], iter(tensors)
        for spec, constants, slots in self.templates:
            leaves = list(constants)
            for slot in slots:
                leaves[slot] = next(given)
            inp, args, kwargs = pytree.tree_unflatten(leaves, spec)
            results.append(self.fn(inp, *args, **kwargs))
        return tuple(results)


def eager_outputs(module: SamplesModule) -> list[torch.Tensor] | str:
    """The eager results as a flat tensor list, or why the samples cannot be compared."""
    try:
        with torch.no_grad():
            leaves = pytree.tree_leaves(module(*module.inputs))
    except Exception as exc:  # an OpInfo sample eager itself rejects on this machine
        return f"eager fails: {type(exc).__name__}"
    if not leaves or not all(isinstance(x, torch.Tensor) for x in leaves):
        return "returns non-tensor values"
    # the IR holds a complex tensor as its real view (compiler/frontend/aten/complex_numbers.py)
    return [torch.view_as_real(x.resolve_conj()) if x.is_complex() else x for x in leaves]


def check_samples(op, samples: list) -> str | None:
    """None when the samples convert and match eager; else why they were skipped."""
    module = SamplesModule(op.op, samples)
    expected = eager_outputs(module)
    if isinstance(expected, str):
        return expected
    try:
        graph = compiler.export(module, tuple(module.inputs))
    except UnsupportedOpsError as exc:
        return "unsupported: " + ", ".join(exc.ops)
    except DayzeroError as exc:
        return str(exc).splitlines()[0]
    text = print_ir(graph)
    assert print_ir(parse_ir(text)) == text
    actual = run_graph(graph, graph.weight_data, module.inputs)
    atol, rtol, _ = TOLERANCES.get(op.name, (1e-5, 1e-5, ""))
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol, equal_nan=True)
    return None


def float32_samples(op, limit: int = MAX_SAMPLES) -> list:
    """Up to `limit` float32 CPU samples of `op`."""
    generator = op.sample_inputs("cpu", torch.float32, requires_grad=False)
    samples = list(itertools.islice(generator, limit))
    if hasattr(generator, "close"):  # now, not when garbage collection hits a later trace
        generator.close()
    return samples


def _id(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


# Checked on every run; the rest of op_db as the fixed sample (`pytest --sweep` runs every op).
CORE_OPS = {
    "add", "mul", "div", "sub", "exp", "rsqrt", "sigmoid", "tanh", "where", "clamp", "pow",
    "matmul", "bmm", "nn.functional.linear", "nn.functional.embedding", "softmax",
    "nn.functional.layer_norm", "nn.functional.gelu", "nn.functional.silu",
    "nn.functional.scaled_dot_product_attention", "nn.functional.conv2d", "cat", "reshape",
    "transpose", "permute", "expand", "slice", "mean", "sum", "amax", "cumsum", "topk", "sort",
    "gather", "index_select", "argmax", "masked_fill", "tril", "argsort", "histc", "index_put",
    "scatter", "scatter_add",
    "scatter_reduce.sum", "scatter_reduce.prod", "scatter_reduce.mean", "scatter_reduce.amax",
    "scatter_reduce.amin", "fft.fft", "fft.fftn", "fft.rfft", "fft.irfft", "fft.ifft2",
    "polar", "view_as_complex", "complex", "real",
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if metafunc.definition.name == "test_opinfo":
        ops = sweep(metafunc.config, op_db, _id, always=CORE_OPS)
        metafunc.parametrize("op", ops, ids=_id)


# OpInfo's samples call deprecated and beta ops on purpose; what they warn is torch's to say.
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_opinfo(op):
    if op.name in NOT_COMPARABLE:
        pytest.skip(NOT_COMPARABLE[op.name])
    if torch.float32 not in op.supported_dtypes("cpu"):
        pytest.skip("no float32 CPU support")
    samples = float32_samples(op)
    if not samples:
        pytest.skip("no float32 samples")
    if len(samples) > 1:
        try:
            if check_samples(op, samples) is None:
                return  # all samples in one export: the common, fast case
        except Exception:  # a mismatch or a bug: the one-by-one run below names the sample
            pass
    reasons: list[str | None] = []
    for sample in samples:  # one by one; two skips in a row end it (keeps the run short)
        reasons.append(check_samples(op, [sample]))
        if len(reasons) >= 2 and reasons[-1] and reasons[-2]:
            break
    if all(reasons):
        pytest.skip(reasons[0])
