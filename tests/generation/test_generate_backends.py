"""The same generation artifact semantics on every backend: reference (the decomposition of
paged_attention through torch) and triton (its Triton kernel, under the interpreter) generate
transformers' tokens too."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton (no CUDA here)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import runtime  # noqa: E402
from tests.generation.tiny_lms import compile_lm, prompt, tiny_lm  # noqa: E402


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_every_backend_generates_transformers_tokens(backend, tmp_path):
    if backend == "triton":
        pytest.importorskip("triton")
    hf = tiny_lm("llama")
    model = runtime.load(compile_lm(hf, tmp_path / "lm.dz", backend=backend))
    ids = prompt(7, seed=1)
    got = model.generate([ids[0].numpy(), ids[0, :3].numpy()], max_new_tokens=6,
                         eos_token_id=[])
    for row, tokens in enumerate((ids, ids[:, :3])):
        with torch.no_grad():
            want = hf.generate(tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=6,
                               do_sample=False, pad_token_id=0, eos_token_id=None)[0].numpy()
        np.testing.assert_array_equal(got[row, 7 - tokens.shape[1]:], want)
