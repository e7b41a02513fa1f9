"""Write the regression references: `python tests/regression/make_references.py [CASE ...]`.

For each case (tests/regression/cases.py), runs the example model in torch eager on the case's
fixed inputs and stores `input.<name>` and `output.<i>` arrays in data/<case>.npz. Rerun it only
when a change to an example model (or to transformers' model code) is intended; the regression
test first checks that eager still reproduces the stored outputs and says so when it does not.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.utils._pytree as pytree

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from compiler.spec import load_spec  # noqa: E402
from tests.regression.cases import CASES, Case  # noqa: E402


def reference_arrays(case: Case) -> dict[str, np.ndarray]:
    """The case's inputs (named after forward()'s arguments) and eager outputs."""
    spec = load_spec(case.spec_path)
    inputs = case.inputs()
    names = list(spec.module.forward.__code__.co_varnames[1:1 + len(inputs)])
    with torch.no_grad():
        outputs = pytree.tree_leaves(spec.module(*inputs))
    arrays = {f"input.{n}": x.numpy() for n, x in zip(names, inputs)}
    arrays.update({f"output.{i}": y.numpy() for i, y in enumerate(outputs)})
    return arrays


def main(names: list[str]) -> int:
    for case in CASES:
        if names and case.name not in names:
            continue
        arrays = reference_arrays(case)
        case.path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(case.path, **arrays)
        shapes = ", ".join(f"{k}{list(v.shape)}" for k, v in arrays.items())
        print(f"wrote {case.path.name}: {shapes}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
