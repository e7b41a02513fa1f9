"""OpInfo conformance on the triton backend, under Triton's interpreter.

The subset is the ops the backend runs as generated kernels (elementwise math, comparisons,
where/clamp, pow with a constant exponent, reductions, softmax, norms). For each, a couple of
torch's OpInfo float32 samples go through tests/compiler/test_opinfo.py's machinery, are compiled
with backend="triton" (the fusion-group pipeline, so multi-op samples become one kernel) and must
match eager within 1e-4. A sample the backend cannot take (pow with a tensor exponent, say) is
skipped with the backend's reason; an op none of whose samples compile is skipped, never passed.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (no CUDA here)

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.testing._internal.opinfo.core import SampleInput  # noqa: E402

import backends  # noqa: E402
import compiler  # noqa: E402
import runtime  # noqa: E402
from backends.triton import kernel_sources  # noqa: E402
from backends.triton.emit import POW_EXPONENTS  # noqa: E402
from compiler.config import load_config  # noqa: E402
from compiler.driver import lower_and_write  # noqa: E402
from compiler.errors import DayzeroError  # noqa: E402
from compiler.frontend import UnsupportedOpsError  # noqa: E402
from compiler.ir import parse_ir  # noqa: E402
from compiler.log import SILENT  # noqa: E402
from tests.compiler.test_opinfo import SamplesModule, eager_outputs, float32_samples  # noqa: E402

pytest.importorskip("triton")
# The interpreter computes masked-off lanes too (log(0), 1/0 there are never stored).
# OpInfo's samples call deprecated and degenerate cases on purpose; what they warn is torch's to say
pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

PIPELINE = "remove_noops,fold_constants,eliminate_dead_code,fuse_groups"
TOL = 1e-4
SAMPLES = 3   # compared per op
TRIES = 8     # samples looked at to find SAMPLES the backend takes

UNARY = ["abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
         "reciprocal", "sigmoid", "tanh", "sin", "cos", "tan", "sinh", "cosh", "erf", "floor",
         "ceil", "trunc", "frac", "round", "round.decimals_3", "sign", "sgn", "square", "isnan",
         "isinf", "logical_not", "nan_to_num", "deg2rad", "logit", "special.ndtr",
         "special.entr", "nn.functional.relu", "nn.functional.relu6", "nn.functional.silu",
         "nn.functional.gelu", "nn.functional.leaky_relu", "nn.functional.elu",
         "nn.functional.celu", "nn.functional.hardsigmoid", "nn.functional.hardswish",
         "nn.functional.hardtanh", "nn.functional.hardshrink", "nn.functional.softshrink",
         "nn.functional.softplus", "nn.functional.softsign", "nn.functional.threshold",
         "nn.functional.mish", "nn.functional.logsigmoid", "nn.functional.tanhshrink"]
BINARY = ["add", "sub", "mul", "div.no_rounding_mode", "true_divide", "rsub", "maximum",
          "minimum", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
          "logical_xor", "where", "masked_fill", "clamp", "clamp_min", "clamp_max", "pow",
          "lerp", "addcmul", "addcdiv", "xlogy", "special.xlog1py", "heaviside", "logaddexp",
          "logaddexp2", "nn.functional.prelu", "nn.functional.glu"]
ROWS = ["sum", "mean", "amax", "amin", "var", "std", "var_mean", "std_mean", "nansum",
        "nanmean", "logsumexp", "softmax", "log_softmax", "nn.functional.softmin",
        "nn.functional.layer_norm", "nn.functional.rms_norm", "nn.functional.normalize", "norm",
        "linalg.vector_norm", "nn.functional.cosine_similarity",
        "nn.functional.pairwise_distance", "nn.functional.mse_loss", "nn.functional.l1_loss",
        "nn.functional.smooth_l1_loss", "nn.functional.huber_loss", "nn.functional.kl_div",
        "nn.functional.binary_cross_entropy_with_logits"]
# IR ops the backend has no kernel for: listed so that their skip shows the gap.
GAPS = ["prod", "remainder", "fmod", "atan2", "div.floor_rounding", "div.trunc_rounding",
        "nn.functional.group_norm"]
SUBSET = UNARY + BINARY + ROWS + GAPS

_BY_ID = {f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name: op
          for op in op_db}


def _compiled(module: SamplesModule, tmp_path) -> tuple[object, int] | str:
    """(loaded artifact, number of generated kernels), or why triton does not take it: the
    IR lacks an op or export fails (as test_opinfo skips them), or the backend refuses a node.
    Any other failure, a pass crash say, fails the test."""
    try:
        graph = compiler.export(module, tuple(module.inputs))
    except UnsupportedOpsError as exc:
        return "no IR op for " + ", ".join(exc.ops)
    except DayzeroError as exc:
        return str(exc).splitlines()[0]
    out = tmp_path / f"m{len(list(tmp_path.iterdir()))}.dz"
    try:
        path = lower_and_write(graph, out, backends.get("triton"), load_config(None),
                               passes=PIPELINE, dump_ir=None, force=False, log=SILENT)
    except DayzeroError as exc:
        if not exc.what.startswith("backend 'triton' does not support"):
            raise
        return exc.what
    kernels = kernel_sources(parse_ir((path / "graph.dzir").read_text()))
    return runtime.load(path), len(kernels)


def _run(module: SamplesModule, tmp_path) -> int | str:
    """Compile and compare one module of samples; the number of kernels, or why it was not
    compared."""
    expected = eager_outputs(module)
    if isinstance(expected, str):
        return expected
    compiled = _compiled(module, tmp_path)
    if isinstance(compiled, str):
        return compiled
    loaded, kernels = compiled
    got = loaded(*module.inputs)
    assert len(got) == len(expected)
    for g, w in zip(got, expected):
        torch.testing.assert_close(torch.from_numpy(g), w, atol=TOL, rtol=TOL, equal_nan=True)
    return kernels


@pytest.mark.parametrize("name", SUBSET)
def test_opinfo_on_triton(name, tmp_path):
    op = _BY_ID[name]
    reasons: list[str] = []
    kernels, compared = 0, 0
    for sample in float32_samples(op, TRIES):
        result = _run(SamplesModule(op.op, [sample]), tmp_path)
        if isinstance(result, str):
            reasons.append(result)
            continue
        kernels, compared = kernels + result, compared + 1
        if compared == SAMPLES:
            break
    if not compared:
        pytest.skip(f"triton takes none of {len(reasons)} samples: {reasons[0]}")
    assert kernels, f"{name}: no generated kernel ran (host ops only)"


@pytest.mark.parametrize("exponent", sorted(POW_EXPONENTS))
def test_pow_with_a_constant_exponent(exponent, tmp_path):
    """OpInfo's pow samples all take a tensor exponent, which the backend refuses; its base
    tensor (and its absolute value, for the fractional exponents) with each exponent the
    kernels inline runs as a kernel."""
    base = float32_samples(_BY_ID["pow"], 2)[1].input
    samples = [SampleInput(base, args=(exponent,)), SampleInput(base.abs(), args=(exponent,))]
    assert _run(SamplesModule(torch.pow, samples), tmp_path) == 2


def test_pow_with_another_exponent_is_refused(tmp_path):
    base = float32_samples(_BY_ID["pow"], 2)[1].input
    reason = _run(SamplesModule(torch.pow, [SampleInput(base, args=(2.5,))]), tmp_path)
    assert isinstance(reason, str) and "does not support: pow" in reason


# OpInfo samples past the first few that exposed bugs (torch is pinned, so indices are stable).
REGRESSIONS = [("rsub", 9), ("rsub", 10),               # alpha scales self, not other
               ("var", 5), ("var", 11),                 # a fractional correction
               ("var", 15), ("var", 16),                # empty rows still reduce (to nan)
               ("nn.functional.layer_norm", 4),         # ... and to nothing
               ("nn.functional.softmin", 6),            # softmax of a 0-d tensor
               ("norm", 2)]                             # pow of a per-row value


@pytest.mark.parametrize("name,index", REGRESSIONS)
def test_opinfo_samples_that_exposed_bugs(name, index, tmp_path):
    op = _BY_ID[name]
    result = _run(SamplesModule(op.op, [float32_samples(op, index + 1)[index]]), tmp_path)
    assert isinstance(result, int) and result > 0, result
